"""The megatron backend's training step against the fsdp backend's, on one GPU, in one run.

The same random Qwen3-0.6B-shaped model (bf16 compute over float32 weights), the same batch
(`--train-batch` rows of `--train-len` tokens, `--prompt-len` of them prompt, the actor's PPO
loss, one micro-batch) through one rank of each backend (`relax.backends.registry`), timed
after a warm-up step; MFU as `bench/gpu_throughput.py` counts it (model FLOPs / time / the GPU's
dense bf16 peak). Prints a table; the last line is `megatron_mfu=<x> fsdp_mfu=<y>`.

    python3 bench/megatron_throughput.py [--train-batch 16] [--train-len 1024] [--layers 28]
        [--chunk 2048] [--compile] [--out bench/results/megatron_throughput.json]

`--compile` also times both with --use-torch-compile (each decoder layer compiled).
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

from gpu_throughput import bench_fsdp, flops_per_token, peak_flops, qwen3_06b_config  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--train-batch", type=int, default=16)
    parser.add_argument("--train-len", type=int, default=1024)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--train-steps", type=int, default=3)
    parser.add_argument("--layers", type=int, default=28)
    parser.add_argument("--chunk", type=int, default=2048, help="--log-probs-chunk-size of both")
    parser.add_argument("--compile", action="store_true", help="also time both with --use-torch-compile")
    parser.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "megatron_throughput.json"))
    args = parser.parse_args()

    import torch
    from transformers import AutoModelForCausalLM

    if not torch.cuda.is_available():
        sys.exit("bench/megatron_throughput.py needs a CUDA GPU")
    config = qwen3_06b_config(args.layers)
    tokens = args.train_batch * args.train_len
    flops, peak = flops_per_token(config, args.train_len) * tokens, peak_flops()
    result: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "args": vars(args),
                    "train": {}}
    try:
        import megatron.core

        result["megatron_core"] = megatron.core.__version__
    except ImportError:
        sys.exit("megatron-core is not installed: pip install 'relax-rl[megatron]'")
    runs = [("megatron", "megatron", False), ("fsdp", "fsdp", False)]
    if args.compile:
        runs += [("megatron compiled", "megatron", True), ("fsdp compiled", "fsdp", True)]
    with tempfile.TemporaryDirectory() as tmp:
        torch.manual_seed(0)
        AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(tmp)
        for name, backend, comp in runs:
            try:
                row = bench_fsdp(tmp, config, args.train_batch, args.train_len, args.prompt_len, args.train_steps,
                                 args.chunk, compile_layers=comp, backend=backend)
            except torch.OutOfMemoryError as exc:
                row = {"seconds": None, "peak_gib": None, "error": f"out of memory: {str(exc)[:200]}"}
            torch.cuda.empty_cache()
            row["tokens_per_s"] = tokens / row["seconds"] if row.get("seconds") else None
            row["mfu"] = flops / row["seconds"] / peak if peak and row.get("seconds") else None
            result["train"][name] = row
            print(f"train   {name:<16}: {row.get('seconds') or float('nan'):.3f} s/step   "
                  f"{row['tokens_per_s'] or float('nan'):>9.0f} tok/s   peak {row.get('peak_gib') or float('nan'):.1f} "
                  f"GiB   MFU {(row['mfu'] or float('nan')):.3f}  {row.get('error', '')}", flush=True)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    def best(backend: str) -> float:  # the faster of its plain and compiled steps
        return max((r["mfu"] or 0.0 for k, r in result["train"].items() if k.split()[0] == backend),
                   default=float("nan"))

    print(f"megatron_mfu={best('megatron'):.3f} fsdp_mfu={best('fsdp'):.3f}")


if __name__ == "__main__":
    main()
