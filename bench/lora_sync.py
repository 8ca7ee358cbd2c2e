"""LoRA weight push against a full weight push, bytes and seconds, for Qwen3-0.6B- and 4B-shaped models.

For each shape (`--shapes`) and adapter rank (`--ranks`; targets all-linear, as `--lora-rank R` runs):
  engine  - a real `hf` engine server (`--load-format dummy --dtype bfloat16 --enable-lora
            --max-lora-rank R`: random bf16 weights built from config.json, adapters on every linear
            layer but the output layer), reached over HTTP, receiving over gloo (`--cpu`, the default
            and the only mode here: no GPU is lent to this bench);
  pushes  - this process pushes, through `relax.distributed.weights.sender.WeightSender` (the path an
            fsdp actor rank takes, Relax's protocol extensions on), bf16 tensors of the model's own
            names and shapes: `full`, every weight (what a run without LoRA pushes every step), and
            `adapter`, the `<module>.lora_A.weight` / `.lora_B.weight` tensors only (what a
            `--lora-rank R` run pushes); one warm-up push each, then `--repeats` timed (median).
Bytes are exact for the published depth (from the shapes). Seconds are the median and the fastest of
the timed pushes (on a shared machine the fastest is the least disturbed; GB/s is from the median). The adapter push is
measured at the model's full depth (28 layers for 0.6B, 36 for 4B: the engine holds the whole model);
the full push at `--layers` (default: 0.6B at its 28, 4B at 8 of 36, since a full-depth 4B-shaped
engine and a sender holding all its weights need ~16 GB of host memory) and, below the full depth,
scaled to it by bytes (`est.` in the table: a full push is bandwidth-bound, its fixed cost of a few
round trips a small part of it).

    python3 bench/lora_sync.py [--shapes 0.6b 4b] [--ranks 16] [--layers 0.6b=28 4b=8] [--repeats 5]
                               [--out bench/results/lora_sync_cpu.json]

Prints a table; the last line is `lora_push_bytes_ratio=<x>` (adapter over full bytes) for the last shape.
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
sys.path.insert(0, ROOT)  # run as `python3 bench/<name>.py`: the repo root imports

DEFAULT_LAYERS = {"0.6b": 28, "4b": 8}  # the full push's depth (the adapter's is always the model's)
BUCKET_BYTES = 512 << 20  # --update-weight-buffer-size default


def shapes_of(shape: str, layers: int | None, rank: int) -> tuple[dict, dict]:
    """(name -> shape) of every weight and of every adapter tensor of the model `shape` at `layers`
    decoder layers, from a model built on the meta device (no memory)."""
    import torch
    from transformers import AutoModelForCausalLM
    from weight_sync import model_config

    from relax.backends.lora import adapter_parameters, add_adapters
    from relax.config.lora import LoraSpec

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(model_config(shape, layers))
    full = {n: tuple(p.shape) for n, p in model.named_parameters()}
    add_adapters(model, LoraSpec(rank, float(rank)))
    return full, {n: tuple(p.shape) for n, p in adapter_parameters(model)}


def nbytes(shapes: dict, itemsize: int = 2) -> int:
    import math

    return sum(math.prod(s) for s in shapes.values()) * itemsize


def tensors(shapes: dict) -> list:
    import torch

    return [(n, torch.empty(s, dtype=torch.bfloat16)) for n, s in shapes.items()]


async def timed_pushes(url: str, named: list, repeats: int, first_version: int) -> list[float]:
    """Seconds of `repeats` pushes of `named` (after one warm-up) through one sender."""
    from relax.distributed.weights.sender import WeightSender

    sender = WeightSender([url], backend="gloo", bucket_bytes=BUCKET_BYTES, timeout_s=1800)
    await sender.connect()
    seconds = []
    try:
        for i in range(repeats + 1):
            stats = await sender.push(named, version=first_version + i)
            seconds.append(stats.seconds)
    finally:
        await sender.close()
    return seconds[1:]


def push_seconds(shape: str, layers: int, rank: int, repeats: int, workdir: str, kinds: tuple[str, ...]) -> dict:
    """Pushes of `kinds` ("full": every weight, "adapter": the adapter tensors) at `layers` decoder
    layers to one engine: {kind: {"layers", "bytes", "seconds": [per push]}}."""
    from weight_sync import model_config

    from relax.backends.hf.launcher import launch_hf_engine
    from relax.backends.hf.tiny_model import build_tiny_tokenizer

    full, adapter = shapes_of(shape, layers, rank)
    path = os.path.join(workdir, f"{shape}-{layers}l-r{rank}")
    model_config(shape, layers).save_pretrained(path)
    build_tiny_tokenizer().save_pretrained(path)
    options = {"load_format": "dummy", "dtype": "bfloat16", "enable_lora": True, "max_lora_rank": rank,
               "lora_target_modules": ["all-linear"], "lora_alpha": float(rank)}
    start = time.perf_counter()
    engine = launch_hf_engine(path, options=options, num_threads=1).wait_ready(timeout=1800)
    print(f"  {shape} ({layers} layers, rank {rank}): engine ready in {time.perf_counter() - start:.0f}s", flush=True)
    out = {}
    try:
        for version, kind in enumerate(kinds):
            shapes = full if kind == "full" else adapter
            seconds = asyncio.run(timed_pushes(engine.url, tensors(shapes), repeats, 100 * version + 1))
            out[kind] = {"layers": layers, "bytes": nbytes(shapes), "seconds": seconds}
    finally:
        engine.terminate()
    return out


def measure(shape: str, full_layers: int, rank: int, repeats: int, workdir: str) -> dict:
    """The adapter push at the model's full depth; the full push at `full_layers` (scaled by bytes to
    the full depth when less: a full push is bandwidth-bound, its fixed cost a small part)."""
    from weight_sync import model_config

    depth = model_config(shape).num_hidden_layers
    full_all, adapter_all = shapes_of(shape, None, rank)
    runs = push_seconds(shape, depth, rank, repeats, workdir, ("adapter", "full") if full_layers >= depth
                        else ("adapter",))
    if full_layers < depth:
        runs |= push_seconds(shape, full_layers, rank, repeats, workdir, ("full",))
    row = {"shape": shape, "rank": rank, "targets": "all-linear", "dtype": "bfloat16", "layers_full": depth}
    for kind, whole in (("full", full_all), ("adapter", adapter_all)):
        run = runs[kind]
        row[kind] = {"tensors": len(whole), "bytes": nbytes(whole), "measured": run,
                     "extrapolated": run["layers"] != depth,
                     "seconds": statistics.median(run["seconds"]) * nbytes(whole) / run["bytes"],
                     "seconds_min": min(run["seconds"]) * nbytes(whole) / run["bytes"]}
    return row


def table(rows: list[dict]) -> str:
    lines = [f"{'shape':<6}{'rank':>5}{'push':>9}{'tensors':>9}{'MB':>10}{'median s':>10}{'min s':>8}{'GB/s':>7}"
             "  measured at", "-" * 80]
    for r in rows:
        for kind in ("full", "adapter"):
            k = r[kind]
            est, gbps = " est." if k["extrapolated"] else "", k["bytes"] / max(k["seconds"], 1e-9) / 1e9
            lines.append(f"{r['shape']:<6}{r['rank']:>5}{kind:>9}{k['tensors']:>9}{k['bytes'] / 1e6:>10.1f}"
                         f"{k['seconds']:>10.3f}{k['seconds_min']:>8.3f}{gbps:>7.2f}  "
                         f"{k['measured']['layers']} of {r['layers_full']} layers{est}")
        lines.append(f"{'':<11}adapter / full: {r['adapter']['bytes'] / r['full']['bytes']:.4f} of the bytes, "
                     f"{r['adapter']['seconds'] / r['full']['seconds']:.4f} of the time")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", nargs="+", default=["0.6b", "4b"])
    parser.add_argument("--ranks", nargs="+", type=int, default=[16])
    parser.add_argument("--layers", nargs="*", default=[], help="shape=N: decoder layers of the full push")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "lora_sync_cpu.json"))
    args = parser.parse_args()
    layers = {**DEFAULT_LAYERS, **{k: int(v) for k, v in (item.split("=") for item in args.layers)}}
    rows = []
    with tempfile.TemporaryDirectory() as workdir:
        for shape in args.shapes:
            for rank in args.ranks:
                rows.append(measure(shape, layers.get(shape, 2), rank, args.repeats, workdir))
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"bench": "lora_sync", "device": "cpu (gloo, hf engine over HTTP)", "bucket_bytes": BUCKET_BYTES,
                   "repeats": args.repeats, "cpu_count": os.cpu_count(), "rows": rows}, f, indent=1)
    print(table(rows))
    last = rows[-1]
    print(f"lora_push_bytes_ratio={last['adapter']['bytes'] / last['full']['bytes']:.4f}")


if __name__ == "__main__":
    main()
