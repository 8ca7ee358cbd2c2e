"""Rollout routing replay (R3) on a tiny Qwen3-MoE on the CPU: engine/trainer log-prob mismatch and
step time with and without R3, in one run.

Setup (tests/unit/backends/routing_cases.py says why): the `hf` engine (in this process) serves the
model in bfloat16, as engines serve models, and the trainer (fsdp or megatron, one float32 rank)
computes in float32; bf16 rounding flips the experts of near-tie tokens. Weights are drawn with std
0.1 so that routing moves log-probs as in a trained model. A dense Qwen3 of the same size through the
same engine gives the level R3 should reach (bf16-vs-float32 numerics alone).

Measured, one run:
  mismatch   per generated token |trainer log-prob - engine log-prob| (mean, p99, max) on the first
             step's weights: dense, MoE without R3, MoE with R3;
  engine     CPU seconds (and wall) to generate the batch with and without
             --enable-return-routed-experts (median of 3), the routing record's bytes per token;
  step       CPU seconds (and wall) of one training step (old log-prob forward + one optimizer step
             over the batch), median of --steps, alternating without / with R3 on the same trainer
             (weights move as they would in training; both see the same sequence of states).
One torch thread everywhere, so a process's CPU time is its compute: on a shared machine the wall
times move with the load (the JSON keeps both, and the load average).

    python3 bench/moe_r3.py [--backend fsdp|megatron] [--rows 32] [--new-tokens 48] [--steps 10]
                            [--device cpu|cuda] [--out bench/results/moe_r3_cpu.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)



def build_models(root: str, hidden: int, layers: int, experts: int, top_k: int) -> dict[str, str]:
    import torch

    from examples.tiny_math.task import tokenizer_corpus
    from relax.utils.tiny_model import build_tiny_qwen3, build_tiny_qwen3_moe, save_tiny_model, train_chatml_tokenizer

    tokenizer = train_chatml_tokenizer(tokenizer_corpus(), vocab_size=300)
    moe = build_tiny_qwen3_moe(tokenizer, hidden_size=hidden, num_layers=layers, num_experts=experts, top_k=top_k,
                               max_position_embeddings=512, seed=1)
    dense = build_tiny_qwen3(tokenizer, hidden_size=hidden, num_layers=layers, max_position_embeddings=512, seed=1)
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        for p in dense.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.1)
    return {"moe": save_tiny_model(moe, tokenizer, os.path.join(root, "moe")),
            "dense": save_tiny_model(dense, tokenizer, os.path.join(root, "dense"))}


def generate(model_dir: str, routed: bool, rows: int, new_tokens: int, repeats: int = 3, device: str = "cpu") -> dict:
    """The batch through an in-process hf engine in bfloat16: rows, the engine's log-probs and
    (`routed`) routing records as data-plane bytes, and the generation's seconds (median of `repeats`)."""
    import torch

    from relax.backends.hf.engine import HFEngine
    from relax.backends.hf.protocol import GenerateRequest, build_output, normalize_generate
    from relax.utils.routing import RoutingShape, decode_reply, to_bytes

    g = torch.Generator().manual_seed(0)
    sizes = torch.randint(8, 48, (rows,), generator=g)
    prompts = [torch.randint(5, 290, (int(n),), generator=g).tolist() for n in sizes]

    async def run():
        engine = HFEngine(model_dir, seed=0, routed_experts=routed, dtype="bfloat16", device=device)
        await engine.start()
        try:
            req = GenerateRequest(input_ids=prompts, return_logprob=True, return_routed_experts=routed,
                                  sampling_params=[{"max_new_tokens": new_tokens, "ignore_eos": True,
                                                    "sampling_seed": i} for i in range(rows)])
            items, _ = normalize_generate(req, engine.tokenizer, vocab_size=engine.vocab_size,
                                          max_context_len=engine.max_context_len)
            await engine.generate(items[:2])  # warm-up
            seconds, cpu = [], []
            for _ in range(repeats):  # seeded: every repeat generates the same tokens
                start, start_cpu = time.perf_counter(), time.process_time()
                results = await engine.generate(items)
                seconds.append(time.perf_counter() - start)
                cpu.append(time.process_time() - start_cpu)
            shape = RoutingShape.from_config(engine.model.config.to_dict()) if routed else None
            return results, (seconds, cpu), shape, [build_output(i, r, weight_version="0", e2e_latency=0.0)
                                                    for i, r in zip(items, results)]
        finally:
            await engine.stop()

    results, seconds, shape, replies = asyncio.run(run())
    routing = [to_bytes(decode_reply(o["meta_info"]["routed_experts"], shape), shape) for o in replies] \
        if routed else None
    return {"tokens": [p + r.output_ids for p, r in zip(prompts, results)],
            "lengths": [len(r.output_ids) for r in results], "logprobs": [r.output_logprobs for r in results],
            "routing": routing, "seconds": statistics.median(seconds[0]), "cpu_s": statistics.median(seconds[1])}


def mismatch(trainer: list[list[float]], engine: list[list[float]]) -> dict[str, float]:
    import numpy as np

    diff = np.abs(np.concatenate([np.subtract(t, e) for t, e in zip(trainer, engine)]))
    return {"mean": float(diff.mean()), "p99": float(np.quantile(diff, 0.99)), "max": float(diff.max())}


def trainer(model_dir: str, backend: str, trainable: bool):
    from relax.algorithms.policy_loss import PolicyLossConfig
    from relax.backends.base import TrainerSpec
    from relax.backends.trainer.trainer import Trainer
    from relax.config.schema import BatchConfig, OptimizerConfig
    from relax.utils.net import free_port

    spec = TrainerSpec(model_path=model_dir, backend=backend, optim=OptimizerConfig(lr=1e-3),
                       batch=BatchConfig(micro_batch_size=8), loss=PolicyLossConfig(), threads=1,
                       routing_replay=True, trainable=trainable)
    return Trainer(0, 1, "127.0.0.1", free_port(), spec)


def step_seconds(worker, rows: dict, r3: bool) -> tuple[float, float]:
    """One training step, the old log-prob forward then one optimizer step over every row: (wall,
    CPU) seconds (one torch thread: the CPU time is the compute, less disturbed by a busy machine)."""
    from relax.types import TrainBatch

    routing = rows["routing"] if r3 else None
    start, start_cpu = time.perf_counter(), time.process_time()
    old = worker.compute_log_probs(rows["tokens"], rows["lengths"], routing=routing)
    lengths = rows["lengths"]
    worker.train(TrainBatch(tokens_RL=rows["tokens"], response_lengths_R=lengths,
                            loss_masks_RT=[[1] * n for n in lengths], old_log_probs_RT=old,
                            advantages_RT=[[(-1.0) ** i] * n for i, n in enumerate(lengths)],
                            rollout_log_probs_RT=rows["logprobs"], rollout_routed_experts_RB=routing),
                 1, [sum(lengths)])
    if not r3:
        worker.forget_routing()  # (the policy's forward recorded R2 routing; R3 rows record nothing)
    return time.perf_counter() - start, time.process_time() - start_cpu


def measure(args: argparse.Namespace) -> dict:
    import torch

    torch.set_num_threads(1)
    root = tempfile.mkdtemp(prefix="moe_r3_")
    paths = build_models(root, args.hidden, args.layers, args.experts, args.top_k)
    dense = generate(paths["dense"], False, args.rows, args.new_tokens, device=args.device)
    plain = generate(paths["moe"], False, args.rows, args.new_tokens, device=args.device)
    rows = generate(paths["moe"], True, args.rows, args.new_tokens, device=args.device)
    worker = trainer(paths["dense"], args.backend, trainable=False)
    dense_level = mismatch(worker.compute_log_probs(dense["tokens"], dense["lengths"]), dense["logprobs"])
    worker.shutdown()
    worker = trainer(paths["moe"], args.backend, trainable=True)
    without = mismatch(worker.compute_log_probs(rows["tokens"], rows["lengths"]), rows["logprobs"])
    worker.forget_routing()
    with_r3 = mismatch(worker.compute_log_probs(rows["tokens"], rows["lengths"], routing=rows["routing"]),
                       rows["logprobs"])
    times = {False: [], True: []}
    for _ in range(args.steps):
        for r3 in (False, True):
            times[r3].append(step_seconds(worker, rows, r3))
    worker.shutdown()
    tokens = sum(len(t) - 1 for t in rows["tokens"])
    median = lambda r3, k: statistics.median(t[k] for t in times[r3])  # noqa: E731
    return {
        "backend": args.backend, "device": args.device, "cpus": os.cpu_count(), "torch_threads": 1,
        "model": {"hidden": args.hidden, "layers": args.layers, "experts": args.experts, "top_k": args.top_k,
                  "init_std": 0.1},
        "rows": args.rows, "new_tokens": args.new_tokens, "engine_dtype": "bfloat16", "trainer_dtype": "float32",
        "mismatch": {"dense": dense_level, "moe_without_r3": without, "moe_with_r3": with_r3},
        "engine_s": {"without_record": plain["seconds"], "with_record": rows["seconds"]},
        "engine_cpu_s": {"without_record": plain["cpu_s"], "with_record": rows["cpu_s"]},
        "routing_bytes_per_token": sum(len(b) for b in rows["routing"]) / tokens,
        "step_s": {"without_r3": median(False, 0), "with_r3": median(True, 0), "runs": args.steps},
        "step_cpu_s": {"without_r3": median(False, 1), "with_r3": median(True, 1), "runs": args.steps,
                       "samples_without": times[False], "samples_with": times[True]},
        "step_overhead_cpu": median(True, 1) / median(False, 1) - 1.0,
        "load_average": os.getloadavg()[0],
    }


def table(r: dict) -> str:
    m = r["mismatch"]
    lines = [f"R3 on a tiny Qwen3-MoE ({r['model']['layers']} layers, {r['model']['experts']} experts, "
             f"top-{r['model']['top_k']}), engine bf16 / trainer fp32 ({r['backend']}), {r['rows']} rows",
             f"{'per-token |trainer - engine| log-prob':<40}{'mean':>10}{'p99':>10}{'max':>10}"]
    for name, key in (("dense model", "dense"), ("MoE without R3", "moe_without_r3"), ("MoE with R3", "moe_with_r3")):
        lines.append(f"{name:<40}{m[key]['mean']:>10.5f}{m[key]['p99']:>10.5f}{m[key]['max']:>10.5f}")
    e, s = r["engine_cpu_s"], r["step_cpu_s"]
    lines += [f"engine generate, CPU s (median of 3): {e['without_record']:.3f} without recording, "
              f"{e['with_record']:.3f} with ({e['with_record'] / e['without_record'] - 1:+.1%}); record "
              f"{r['routing_bytes_per_token']:.0f} bytes/token",
              f"training step, CPU s (median of {s['runs']}): {s['without_r3']:.3f} without R3, {s['with_r3']:.3f} "
              f"with ({r['step_overhead_cpu']:+.1%}); wall {r['step_s']['without_r3']:.3f} / "
              f"{r['step_s']['with_r3']:.3f} s (load average {r['load_average']:.1f})"]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="fsdp", choices=["fsdp", "megatron"])
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--top-k", type=int, default=2)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                        help="cuda: engine and trainer on the GPU (time it by wall seconds, not CPU seconds)")
    parser.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "moe_r3_cpu.json"))
    args = parser.parse_args()
    if args.device == "cpu":
        os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")  # megatron-core and the trainer would pick a visible GPU
    result = measure(args)
    print(table(result))
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
