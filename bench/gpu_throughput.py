"""Decode and train throughput on one GPU, each against its plain-HF counterpart, in one run.

(a) Decode: the `hf` engine's decoder (`relax.backends.hf.decoder.BatchDecoder`, the code path a
    rollout runs, without HTTP) against `model.generate` on the same random Qwen3-0.6B-shaped
    model (bf16), `--prompt-len` random prompt tokens, `--new-tokens` sampled tokens per row
    (no early stop), at each `--batches` size. Tokens per second of generated tokens. cuDNN
    attention is off for both (the engine turns it off; for `generate` it is the faster
    baseline, since cuDNN builds a plan for every new KV length).
(b) Train: one fsdp rank (`FSDPTrainWorker`, world size 1, the actor's PPO loss, bf16 compute
    with float32 master weights, the batch in one micro-batch, at each `--chunks` log-prob chunk
    size) against a plain HF step (float32 weights under bf16 autocast, HF's cross-entropy loss,
    fused AdamW, micro-batches of `--plain-micro-batch` rows with gradient accumulation, since
    HF's loss makes float32 logits) on `--train-batch` rows of `--train-len` tokens. MFU = model
    FLOPs / time / the GPU's dense bf16 peak, with model FLOPs per token = 6 * (matmul
    parameters, the LM head included) + 6 * layers * attention width * sequence length (causal
    attention, forward + backward). Peak GPU memory of each step is reported; `--profile` prints
    the top GPU kernels of one fsdp step.

    python3 bench/gpu_throughput.py [--batches 64 256] [--new-tokens 256] [--prompt-len 64]
        [--train-batch 16] [--train-len 1024] [--layers 28] [--chunks -1 2048] [--plain-micro-batch 4]
        [--compile] [--profile] [--skip-decode] [--skip-train]
        [--out bench/results/gpu_throughput.json]

Prints a table; the last line is `engine_vs_generate=<r> fsdp_mfu=<x> plain_mfu=<y>` (r at the
largest batch).
"""

from __future__ import annotations

import dataclasses

import argparse
import json
import multiprocessing as mp
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # run as `python3 bench/<name>.py`: the repo root imports

PEAK_BF16_FLOPS = {"H100": 989e12, "H200": 989e12, "A100": 312e12}  # dense, SXM


def qwen3_06b_config(layers: int):
    from transformers import Qwen3Config

    return Qwen3Config(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=layers,
                       num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=4096,
                       tie_word_embeddings=True, rope_theta=1e6, pad_token_id=0, eos_token_id=1)


def peak_flops() -> float | None:
    import torch

    name = torch.cuda.get_device_name()
    return next((v for k, v in PEAK_BF16_FLOPS.items() if k in name), None)


def flops_per_token(config, seq_len: int) -> float:
    h, v, layers = config.hidden_size, config.vocab_size, config.num_hidden_layers
    attn = config.num_attention_heads * config.head_dim
    kv = config.num_key_value_heads * config.head_dim
    per_layer = h * attn + 2 * h * kv + attn * h + 3 * h * config.intermediate_size
    return 6 * (layers * per_layer + v * h) + 6 * layers * attn * seq_len


class _NoText:
    """Stands in for a tokenizer: the bench has no vocabulary and asks for no stop strings."""

    def decode(self, ids, **_):
        return ""


def sync():
    import torch

    torch.cuda.synchronize()


def bench_decode(model, batch: int, prompt_len: int, new_tokens: int, samples: int = 1) -> dict:
    import torch

    from relax.backends.hf.decoder import BatchDecoder
    from relax.backends.hf.rows import DecodeRow
    from relax.backends.hf.sampling import parse_sampling_params

    g = torch.Generator().manual_seed(batch)
    prompts = torch.randint(2, model.config.vocab_size, (batch, prompt_len), generator=g)
    out = {"batch": batch}
    # plain HF generate
    with torch.inference_mode():
        model.generate(prompts[:2, :8].cuda(), max_new_tokens=4, min_new_tokens=4, do_sample=True)  # warm-up
        sync()
        t0 = time.perf_counter()
        model.generate(prompts.cuda(), attention_mask=torch.ones_like(prompts).cuda(), max_new_tokens=new_tokens,
                       min_new_tokens=new_tokens, do_sample=True, temperature=1.0, top_k=0, top_p=1.0)
        sync()
    out["generate_tok_s"] = batch * new_tokens / (time.perf_counter() - t0)
    # the engine's decoder
    decoder = BatchDecoder(model, _NoText(), device="cuda", eos_token_ids=[1], max_context_len=4096, seed=0)
    params = parse_sampling_params({"temperature": 1.0, "max_new_tokens": new_tokens, "ignore_eos": True})
    warm = parse_sampling_params({"temperature": 1.0, "max_new_tokens": 4, "ignore_eos": True})
    decoder.run([DecodeRow(p[:8].tolist(), warm) for p in prompts[:2]])
    from relax.backends.hf.sampling import warm_up_sampler

    warm_up_sampler(model.config.vocab_size, torch.device("cuda"))  # as the engine does at start
    # A serving engine has its decode graphs after its first batches: capture them for this shape.
    decoder.run([DecodeRow(p.tolist(), params) for p in prompts])
    sync()
    t0 = time.perf_counter()
    results = decoder.run([DecodeRow(p.tolist(), params) for p in prompts])
    sync()
    assert all(len(r.output_ids) == new_tokens for r in results)
    out["engine_tok_s"] = batch * new_tokens / (time.perf_counter() - t0)
    out["engine_vs_generate"] = out["engine_tok_s"] / out["generate_tok_s"]
    # As a rollout sends them: every sample with its own sampling_seed.
    seeded = [DecodeRow(p.tolist(), parse_sampling_params({"temperature": 1.0, "max_new_tokens": new_tokens,
                                                           "ignore_eos": True, "sampling_seed": i}))
              for i, p in enumerate(prompts)]
    sync()
    t0 = time.perf_counter()
    decoder.run(seeded)
    sync()
    out["engine_seeded_tok_s"] = batch * new_tokens / (time.perf_counter() - t0)
    if samples > 1:  # the RL shape: `samples` rows per prompt, the prompt prefilled once
        group = [DecodeRow(p.tolist(), params) for p in prompts[:batch // samples] for _ in range(samples)]
        sync()
        t0 = time.perf_counter()
        decoder.run(group)
        sync()
        out[f"engine_{samples}_per_prompt_tok_s"] = len(group) * new_tokens / (time.perf_counter() - t0)
    return out


def train_batch(config, rows: int, length: int, prompt_len: int):
    import torch

    from relax.types import TrainBatch

    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(2, config.vocab_size, (rows, length), generator=g).tolist()
    n = length - prompt_len
    return TrainBatch(tokens_RL=tokens, response_lengths_R=[n] * rows, loss_masks_RT=[[1] * n] * rows,
                      advantages_RT=[[1.0 if r % 2 else -1.0] * n for r in range(rows)],
                      old_log_probs_RT=[[-12.0] * n] * rows)


def train_rank(rank: int, world: int, port: int, job: dict, out: str) -> None:
    """One training rank: build `job["backend"]`'s worker, time `job["steps"]` steps after a
    warm-up, write {seconds, peak_gib, graph_breaks} to `out.<rank>.json`."""
    async_tp = job.get("async_tp", False)
    if job["cuda"] and world > 1 and not async_tp:  # one GPU per rank, as Ray gives each trainer rank
        os.environ["CUDA_VISIBLE_DEVICES"] = job["visible"][rank]  # (before CUDA starts)
    from relax.core.service import env_file_vars

    for key, value in env_file_vars().items():  # what a run's rank gets (configs/env.yaml), before CUDA starts:
        os.environ.setdefault(key, value)  # e.g. CUDA_DEVICE_MAX_CONNECTIONS=1, which megatron's TP overlap needs
    import torch
    from torch._dynamo.utils import counters

    set_inductor_config(job.get("inductor", {}))
    if async_tp:  # every rank sees every GPU (symmetric memory maps its peers' buffers): device = rank
        torch.cuda.set_device(rank)
        set_inductor_config({"_micro_pipeline_tp": True})
    from relax.algorithms.policy_loss import PolicyLossConfig
    from relax.backends.base import ModelParallelSpec, TrainerSpec
    from relax.backends.trainer.trainer import Trainer
    from relax.components.training import step_plan
    from relax.config.schema import BatchConfig, OptimizerConfig

    counters.clear()  # graph breaks of this run's compiled layers only
    cuda = job["cuda"]
    parallel = ModelParallelSpec(tp=job["tp"], sequence_parallel=job.get("sequence_parallel", False)) \
        if job["backend"] == "megatron" else ModelParallelSpec()
    spec = TrainerSpec(model_path=job["model"], optim=OptimizerConfig(lr=1e-6, bf16=cuda),
                       batch=BatchConfig(micro_batch_size=job["rows"], log_probs_chunk_size=job["chunk"]),
                       loss=PolicyLossConfig(), compile_layers=job["compile"], threads=0 if cuda else 1,
                       dist_backend="nccl" if cuda else "gloo", model_parallel=parallel)
    worker = Trainer(rank, world, "127.0.0.1", port, dataclasses.replace(spec, backend=job["backend"]))
    if async_tp:
        enable_tp_symmetric_memory()
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    try:
        batch = train_batch(job["config"], job["rows"], job["length"], job["prompt_len"])
        info = worker.parallel_info()
        _, shards, tokens = step_plan(batch.loss_masks_RT, len(batch), info["dp_size"])
        mine = batch.rows(shards[info["dp_rank"]])
        times = []
        for step in range(job["steps"] + 1):  # the first is warm-up
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            sync()
            t0 = time.perf_counter()
            worker.train(mine, 1, tokens)
            sync()
            if step:
                times.append(time.perf_counter() - t0)
        result = {"seconds": min(times), "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
                  "graph_breaks": sum(counters["graph_break"].values()),  # in compiled layers (want 0)
                  # graphs compiled: a few for all layers (grad mode, shapes), not one per layer (a recompile
                  # each, and past dynamo's recompile_limit the remaining layers run uncompiled)
                  "graphs": counters["stats"]["unique_graphs"],
                  "graph_break_reasons": dict(counters["graph_break"].most_common(5))}
        if job["profile"]:  # one more step (every rank: it is collective), rank 0's under the profiler
            result["gpu_ms"] = profiled_step(lambda: (worker.train(mine, 1, tokens), sync()), rank == 0)
    finally:
        worker.shutdown()
    with open(f"{out}.{rank}.json", "w") as f:
        json.dump(result, f)


KERNEL_KINDS = (("communication", ("nccl",)), ("attention", ("flash", "attn", "sdpa")),
                ("matmul", ("gemm", "cutlass", "cublas", "sm90_xmma", "nvjet", "matmul")))


def enable_tp_symmetric_memory() -> None:
    """Symmetric memory on megatron's tensor-parallel group, which inductor's async tensor parallelism
    (`_micro_pipeline_tp`: an all-gather or reduce-scatter split into pieces beside its matmul) needs."""
    from megatron.core import parallel_state
    from torch.distributed._symmetric_memory import enable_symm_mem_for_group

    enable_symm_mem_for_group(parallel_state.get_tensor_model_parallel_group().group_name)


def inductor_settings(pairs: list[str]) -> dict:
    """`--inductor KEY=VALUE ...` (VALUE as JSON) -> {key: value}."""
    settings = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"--inductor {pair}: expected KEY=VALUE, e.g. reorder_for_compute_comm_overlap=true")
        try:
            settings[key] = json.loads(value)
        except json.JSONDecodeError:
            raise SystemExit(f"--inductor {pair}: VALUE is JSON (true, 3, \"text\", [...])") from None
    return settings


def set_inductor_config(settings: dict) -> None:
    """Set `torch._inductor.config` entries (dotted keys reach its sub-configs) in this rank process."""
    import torch._inductor.config as config

    for key, value in settings.items():
        *parents, name = key.split(".")
        target = config
        for parent in parents:
            target = getattr(target, parent, None)
        if target is None or not hasattr(target, name):
            raise SystemExit(f"--inductor {key}: this torch's inductor has no such setting")
        setattr(target, name, value)


def kernel_kind(name: str) -> str:
    """A GPU kernel's kind for the profile summary, from its name: communication, attention, matmul or other."""
    low = name.lower()
    return next((kind for kind, marks in KERNEL_KINDS if any(m in low for m in marks)), "other")


def profiled_step(step, report: bool) -> dict[str, float] | None:
    """Run `step()` under torch.profiler when `report` (else plainly); print the top GPU kernels and return the
    milliseconds of GPU time per kernel kind (`kernel_kind`): where the step's GPU time goes."""
    if not report:
        step()
        return None
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step()
    events = prof.key_averages()
    print(events.table(sort_by="cuda_time_total", row_limit=30, max_name_column_width=70))
    kinds: dict[str, float] = {}
    for e in events:
        own = getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0)
        if own and e.device_type.name == "CUDA":
            kinds[kernel_kind(e.key)] = kinds.get(kernel_kind(e.key), 0.0) + own / 1e3
    kernels = [(e.time_range.start, e.time_range.end, kernel_kind(e.name) == "communication")
               for e in prof.events() if e.device_type.name == "CUDA" and e.time_range.end > e.time_range.start]
    kinds["communication_overlapped"] = comm_overlapped_us(kernels) / 1e3
    return {k: round(v, 2) for k, v in sorted(kinds.items())}


def comm_overlapped_us(kernels: list[tuple[float, float, bool]]) -> float:
    """Of the communication kernels' time, how much ran while some other kernel ran: `kernels` are
    (start, end, is_communication) in microseconds. 0 means every collective was on the critical path."""
    compute = sorted((s, e) for s, e, comm in kernels if not comm)
    merged: list[list[float]] = []
    for s, e in compute:
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    total = 0.0
    for s, e, comm in kernels:
        if comm:
            total += sum(max(0.0, min(e, me) - max(s, ms)) for ms, me in merged)
    return total


def time_train_step(job: dict, world: int, out: str) -> dict:
    """Every rank of one training run (`train_rank`; `world` > 1: spawned processes, one GPU each);
    rank 0's numbers (the step is collective)."""
    from relax.utils.net import free_port

    port = free_port()
    if world == 1:
        train_rank(0, 1, port, job, out)
    else:
        ctx = mp.get_context("spawn")
        procs = [ctx.Process(target=train_rank, args=(r, world, port, job, out)) for r in range(world)]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        if any(p.exitcode for p in procs):
            raise RuntimeError(f"a rank failed: exit codes {[p.exitcode for p in procs]} (output above)")
    with open(f"{out}.0.json") as f:
        return json.load(f)


def bench_fsdp(model_dir: str, config, rows: int, length: int, prompt_len: int, steps: int, chunk: int,
               profile: bool = False, compile_layers: bool = False) -> dict:
    """One fsdp rank (world size 1) on one GPU: `time_train_step`."""
    job = {"backend": "fsdp", "tp": 1, "model": model_dir, "config": config, "rows": rows, "length": length,
           "prompt_len": prompt_len, "steps": steps, "chunk": chunk, "compile": compile_layers, "profile": profile,
           "cuda": True, "visible": None}
    with tempfile.TemporaryDirectory() as tmp:
        return time_train_step(job, 1, os.path.join(tmp, "step"))


def bench_plain_train(model_dir: str, config, rows: int, length: int, steps: int, micro: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).cuda().train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6, fused=True)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(2, config.vocab_size, (rows, length), generator=g).cuda()
    times = []
    try:
        for step in range(steps + 1):
            torch.cuda.reset_peak_memory_stats()
            sync()
            t0 = time.perf_counter()
            for start in range(0, rows, micro):  # gradient accumulation: HF's loss needs fp32 logits
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = model(input_ids=ids[start:start + micro], labels=ids[start:start + micro]).loss
                (loss * len(ids[start:start + micro]) / rows).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            sync()
            if step:
                times.append(time.perf_counter() - t0)
        return {"seconds": min(times), "peak_gib": torch.cuda.max_memory_allocated() / 2**30}
    except torch.OutOfMemoryError as exc:
        return {"seconds": None, "peak_gib": None, "error": f"out of memory: {str(exc)[:200]}"}
    finally:
        del model, optimizer
        torch.cuda.empty_cache()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--train-batch", type=int, default=16)
    parser.add_argument("--train-len", type=int, default=1024)
    parser.add_argument("--train-steps", type=int, default=3)
    parser.add_argument("--layers", type=int, default=28)
    parser.add_argument("--chunks", type=int, nargs="+", default=[-1],
                        help="--log-probs-chunk-size values the fsdp step is timed with")
    parser.add_argument("--plain-micro-batch", type=int, default=4,
                        help="rows per forward of the plain step (it accumulates gradients over the batch)")
    parser.add_argument("--skip-decode", action="store_true")
    parser.add_argument("--samples-per-prompt", type=int, default=1,
                        help="also decode batch/N prompts x N samples each (prefix sharing)")
    parser.add_argument("--engine-compile", action="store_true",
                        help="compile the decoder layers of the decode model (torch.compile, dynamic shapes)")
    parser.add_argument("--profile", action="store_true", help="print the top GPU kernels of one fsdp step")
    parser.add_argument("--compile", action="store_true",
                        help="also time the fsdp step with --use-torch-compile (decoder layers compiled)")
    parser.add_argument("--skip-train", action="store_true")
    parser.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "gpu_throughput.json"))
    args = parser.parse_args()

    import torch
    from transformers import AutoModelForCausalLM

    if not torch.cuda.is_available():
        sys.exit("bench/gpu_throughput.py needs a CUDA GPU")
    config = qwen3_06b_config(args.layers)
    torch.backends.cuda.enable_cudnn_sdp(False)  # see the module doc
    result: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "args": vars(args)}
    with tempfile.TemporaryDirectory() as tmp:
        torch.manual_seed(0)
        AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(tmp)
        if not args.skip_decode:
            model = AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.bfloat16).cuda().eval()
            if args.engine_compile:  # experiment: compiled decoder layers for both generate and the engine
                for layer in model.model.layers:
                    layer.compile(dynamic=True)
            result["decode"] = []
            for batch in args.batches:
                row = bench_decode(model, batch, args.prompt_len, args.new_tokens, args.samples_per_prompt)
                result["decode"].append(row)
                print(f"decode  batch {batch:>4}: generate {row['generate_tok_s']:>9.0f} tok/s   engine "
                      f"{row['engine_tok_s']:>9.0f} tok/s   engine/generate {row['engine_vs_generate']:.2f}x   "
                      f"engine, seeded rows {row['engine_seeded_tok_s']:>9.0f} tok/s", flush=True)
            del model
            torch.cuda.empty_cache()
        if not args.skip_train:
            tokens = args.train_batch * args.train_len
            flops = flops_per_token(config, args.train_len) * tokens
            peak = peak_flops()
            result["train"] = {}
            runs = [(f"fsdp chunk {c}{' compiled' if comp else ''}",
                     lambda c=c, comp=comp: bench_fsdp(tmp, config, args.train_batch, args.train_len, args.prompt_len,
                                                       args.train_steps, c, args.profile, comp))
                    for comp in ([False, True] if args.compile else [False]) for c in args.chunks]
            runs.append((f"plain mb {args.plain_micro_batch}",
                         lambda: bench_plain_train(tmp, config, args.train_batch, args.train_len, args.train_steps,
                                                   args.plain_micro_batch)))
            for name, run in runs:
                row = run()
                row["mfu"] = flops / row["seconds"] / peak if peak and row.get("seconds") else None
                result["train"][name] = row
                print(f"train   {name:<24}: {row.get('seconds') or float('nan'):.3f} s/step   peak "
                      f"{row.get('peak_gib') or float('nan'):.1f} GiB   MFU "
                      f"{(row['mfu'] or float('nan')):.3f}  {row.get('error', '')}", flush=True)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    ratio = result["decode"][-1]["engine_vs_generate"] if result.get("decode") else float("nan")
    train = result.get("train", {})
    fsdp = max((r["mfu"] or 0.0 for k, r in train.items() if k.startswith("fsdp")), default=float("nan"))
    plain = next((r["mfu"] or float("nan") for k, r in train.items() if k.startswith("plain")), float("nan"))
    print(f"engine_vs_generate={ratio:.2f} fsdp_mfu={fsdp:.3f} plain_mfu={plain:.3f}")


if __name__ == "__main__":
    main()
