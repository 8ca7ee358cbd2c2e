"""The megatron backend's training step against the fsdp backend's, on the same GPUs, in one run.

The same random Qwen3-shaped model (`--shape 0.6b` or `4b` as published, `--layers` deep; bf16
compute over float32 master weights), the same global batch (`--train-batch` rows of
`--train-len` tokens, `--prompt-len` of them prompt, the actor's PPO loss, one optimizer step)
through the two training backends (`relax.backends.registry`), timed after a warm-up step. For
each `--tp` size t: megatron with tensor parallelism t over t GPUs, and fsdp data-parallel over
the same t GPUs (each rank a process that sees one GPU, NCCL between them; the batch split over
data-parallel ranks as the Actor splits it). MFU as `bench/gpu_throughput.py` counts it: model
FLOPs / time / (t x the GPU's dense bf16 peak). Prints a table; the last line is
`megatron_mfu=<x> fsdp_mfu=<y>` for the largest t (each backend's faster of plain and compiled).

    python3 bench/megatron_throughput.py [--shape 0.6b|4b] [--layers 28] [--tp 1 2 4]
        [--backends megatron fsdp] [--train-batch 16] [--train-len 1024] [--chunk 2048]
        [--compile | --compiled-only] [--profile] [--sequence-parallel [--async-tp]] [--inductor KEY=VALUE ...]
        [--out bench/results/megatron_throughput.json]
    python3 bench/megatron_throughput.py --cpu --shape tiny --tp 1 2   # CPU variant (gloo), as CI runs it

`--compile` also times both with --use-torch-compile (each decoder layer compiled); `--compiled-only`
times only those. `--profile`
runs one more step of every run with rank 0 under torch.profiler: it prints the top GPU kernels, and the JSON row
gets the GPU milliseconds per kernel kind (matmul, attention, communication, other: `gpu_ms`, with
`communication_overlapped`: the collectives' time beside another kernel); every compiled
row has its graph breaks' reasons (`graph_break_reasons`).
`--inductor KEY=VALUE` sets a `torch._inductor.config` entry (VALUE as JSON) in every rank before its
layers compile, e.g. `reorder_for_compute_comm_overlap=true` (docs/gpu.md: what those tried at TP=2 gave).
`--async-tp` runs megatron with torch's async tensor parallelism: every rank sees every GPU (the one set
current is its own), symmetric memory on the TP group, inductor's `_micro_pipeline_tp` on.
A Qwen3-4B-shaped model's 36 layers need about 72 GB for weights, gradients and Adam state in one
rank: on one 80 GB GPU use `--layers 12` (the per-layer work, and so MFU, is the model's).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # run as `python3 bench/<name>.py`: the repo root imports
sys.path.insert(0, os.path.join(ROOT, "bench"))

from gpu_throughput import flops_per_token, inductor_settings, peak_flops, time_train_step  # noqa: E402
from weight_sync import model_config  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="0.6b", help="0.6b, 4b (Qwen3 as published) or tiny (--cpu)")
    parser.add_argument("--layers", type=int, default=None, help="decoder layers (default: the shape's)")
    parser.add_argument("--tp", nargs="+", type=int, default=[1], help="tensor-parallel sizes = GPUs per run")
    parser.add_argument("--train-batch", type=int, default=16)
    parser.add_argument("--train-len", type=int, default=1024)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--train-steps", type=int, default=3)
    parser.add_argument("--chunk", type=int, default=2048, help="--log-probs-chunk-size of both")
    parser.add_argument("--backends", nargs="+", default=["megatron", "fsdp"], choices=["megatron", "fsdp"],
                        help="the training backends to time (default: both)")
    parser.add_argument("--sequence-parallel", action="store_true",
                        help="megatron with --sequence-parallel where --tp > 1")
    parser.add_argument("--async-tp", action="store_true",
                        help="megatron with torch's async tensor parallelism (needs --sequence-parallel and "
                             "compiled layers): ranks see every GPU, symmetric memory on the TP group")
    parser.add_argument("--compile", action="store_true", help="also time both with --use-torch-compile")
    parser.add_argument("--compiled-only", action="store_true",
                        help="time only the --use-torch-compile steps (the faster ones on GPUs; half the runs)")
    parser.add_argument("--profile", action="store_true", help="profile one more step of each run (rank 0)")
    parser.add_argument("--inductor", nargs="+", default=[], metavar="KEY=VALUE",
                        help="torch._inductor.config entries for the compiled runs (VALUE as JSON)")
    parser.add_argument("--cpu", action="store_true", help="ranks on the CPU over gloo (no MFU): the code path")
    parser.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "megatron_throughput.json"))
    args = parser.parse_args()
    inductor = inductor_settings(args.inductor)
    if args.async_tp and not (args.sequence_parallel and args.compiled_only):
        parser.error("--async-tp needs --sequence-parallel and --compiled-only (it overlaps the compiled "
                     "layers' sequence-parallel all-gathers and reduce-scatters with their matmuls)")

    import torch
    from transformers import AutoModelForCausalLM

    if not args.cpu and not torch.cuda.is_available():
        sys.exit("bench/megatron_throughput.py needs a CUDA GPU (or --cpu)")
    try:
        import megatron.core
    except ImportError:
        sys.exit("megatron-core is not installed: pip install 'relax-rl[megatron]'")
    gpus = 0 if args.cpu else torch.cuda.device_count()
    if not args.cpu and max(args.tp) > gpus:
        sys.exit(f"--tp {max(args.tp)} needs {max(args.tp)} GPUs; this machine has {gpus}")
    config = model_config(args.shape, args.layers)
    tokens = args.train_batch * args.train_len
    flops, peak = flops_per_token(config, args.train_len) * tokens, None if args.cpu else peak_flops()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    visible = visible.split(",") if visible else [str(i) for i in range(gpus)]
    result: dict = {"device": "cpu (gloo)" if args.cpu else f"{gpus}x {torch.cuda.get_device_name()}",
                    "torch": torch.__version__, "megatron_core": megatron.core.__version__, "args": vars(args),
                    "config": {k: getattr(config, k) for k in ("hidden_size", "intermediate_size", "num_hidden_layers",
                                                               "num_attention_heads", "vocab_size")},
                    "train": {}}
    modes = [True] if args.compiled_only else [False, True] if args.compile else [False]
    runs = [(b, c) for c in modes for b in args.backends]
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = os.path.join(tmp, "model")
        torch.manual_seed(0)
        AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(model_dir)
        for t in args.tp:
            for backend, comp in runs:
                sp = " sp" if backend == "megatron" and args.sequence_parallel and t > 1 else ""
                sp += " async-tp" if sp and args.async_tp else ""
                name = f"{backend}{' compiled' if comp else ''} tp={t}{sp}"
                job = {"backend": backend, "tp": t, "model": model_dir, "config": config, "rows": args.train_batch,
                       "length": args.train_len, "prompt_len": args.prompt_len, "steps": args.train_steps,
                       "chunk": args.chunk, "compile": comp, "profile": args.profile, "cuda": not args.cpu,
                       "sequence_parallel": args.sequence_parallel and t > 1, "inductor": inductor,
                       "visible": visible, "async_tp": args.async_tp and backend == "megatron" and t > 1}
                try:
                    row = time_train_step(job, t, os.path.join(tmp, name.replace(" ", "_")))
                except (RuntimeError, torch.OutOfMemoryError) as exc:
                    row = {"seconds": None, "peak_gib": None, "error": str(exc)[:300]}
                if not args.cpu:
                    torch.cuda.empty_cache()
                row.update(backend=backend, tp=t, compiled=comp,
                           tokens_per_s=tokens / row["seconds"] if row["seconds"] else None,
                           mfu=flops / row["seconds"] / (peak * t) if peak and row["seconds"] else None)
                result["train"][name] = row
                print(f"train   {name:<24}: {row['seconds'] or float('nan'):.3f} s/step   "
                      f"{row['tokens_per_s'] or float('nan'):>9.0f} tok/s   peak/rank "
                      f"{row['peak_gib'] or float('nan'):.1f} GiB   MFU {row['mfu'] or float('nan'):.3f}  "
                      f"{'graph breaks ' + str(row['graph_breaks']) if comp and 'graph_breaks' in row else ''}"
                      f"{', graphs ' + str(row['graphs']) if comp and 'graphs' in row else ''}"
                      f"{row.get('error', '')}", flush=True)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)

    def best(backend: str) -> float:  # the faster of its plain and compiled steps at the largest t
        return max((r["mfu"] for r in result["train"].values() if r["backend"] == backend
                    and r["tp"] == max(args.tp) and r["mfu"] is not None), default=float("nan"))

    print(f"megatron_mfu={best('megatron'):.3f} fsdp_mfu={best('fsdp'):.3f}")


if __name__ == "__main__":
    main()
