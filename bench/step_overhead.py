"""How much of a quickstart step is model compute, and how much is everything else.

Runs the CPU quickstart launch script for a few steps (no eval) and splits each step's wall
time (`time/step`) into
  model compute = engine decode time (`compute/generate_seconds`, the busiest engine)
                + training forward/backward/optimizer and log-prob passes (`compute/train_seconds`)
                + reference forward (`compute/reference_seconds`, when deployed)
  overhead      = the rest: Serve hops, TransferQueue, tokenisation, rewards, weight sync, waiting.
The first step is reported but left out of the fraction (one-time warm-up: first allocations,
first weight-sync group use).

    python3 bench/step_overhead.py [--steps 8] [--shape quickstart|lean] [--out bench/results/step_overhead.json]

`--shape lean` is the small step of issue 13: the quickstart's 1.1M-parameter model, 8 prompts x
8 samples of at most 24 tokens, colocate, 2 engines, 1 training rank, dynamic batching, no
reference (KL_LOSS_COEF=0). Prints a table and ends with `overhead_fraction=<x>
samples_per_s=<y>` (steady-state steps: samples per step / median step time).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # run as `python3 bench/<name>.py`: the repo root (examples/, relax/) imports
COMPUTE_KEYS = ("compute/generate_seconds", "compute/train_seconds", "compute/reference_seconds")


SHAPES = {  # extra environment and flags of the quickstart script
    "quickstart": ({}, []),
    "lean": ({"KL_LOSS_COEF": "0"}, ["--rollout-batch-size", "8", "--n-samples-per-prompt", "8",
                                     "--global-batch-size", "64", "--rollout-max-response-len", "24"]),
}


def run_quickstart(steps: int, exp_dir: str, shape: str = "quickstart") -> str:
    extra_env, extra_args = SHAPES[shape]
    env = dict(os.environ, EXP_DIR=exp_dir, NUM_ROLLOUT=str(steps), EVAL_INTERVAL="0", SAVE_INTERVAL="0",
               **extra_env)
    metrics = os.path.join(exp_dir, "run", "metrics.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)  # the tracker appends; this run's steps only
    subprocess.run(["bash", os.path.join(ROOT, "scripts/training/text/run-tiny-cpu.sh"), *extra_args], env=env,
                   check=True, cwd=ROOT)
    return metrics


def step_rows(metrics_path: str) -> list[dict[str, float]]:
    with open(metrics_path) as f:
        rows = [json.loads(line) for line in f]
    steps = [r for r in rows if "time/step" in r]
    out = []
    for r in steps:
        compute = sum(r.get(k, 0.0) for k in COMPUTE_KEYS)
        out.append({"step": r["step"] + 1, "wall": r["time/step"], "samples": r.get("rollout/num_samples", 0.0),
                    "generate": r.get(COMPUTE_KEYS[0], 0.0),
                    "train": r.get(COMPUTE_KEYS[1], 0.0), "reference": r.get(COMPUTE_KEYS[2], 0.0),
                    "compute": compute, "overhead": r["time/step"] - compute,
                    "sync": r.get("weight_sync/seconds", 0.0), "rollout": r.get("time/rollout", 0.0)})
    return out


def overhead_fraction(rows: list[dict[str, float]]) -> float:
    steady = rows[1:] or rows
    return sum(r["overhead"] for r in steady) / sum(r["wall"] for r in steady)


def print_table(rows: list[dict[str, float]]) -> None:
    cols = ("step", "wall", "generate", "train", "reference", "compute", "overhead", "sync")
    print(" ".join(f"{c:>9}" for c in cols) + "  overhead%")
    for r in rows:
        print(" ".join(f"{r[c]:>9.3f}" if c != "step" else f"{int(r[c]):>9d}" for c in cols)
              + f"  {100 * r['overhead'] / r['wall']:>8.1f}%")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="quickstart")
    parser.add_argument("--exp-dir", default=os.path.join(ROOT, "outputs", "bench-step-overhead"))
    parser.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "step_overhead.json"))
    parser.add_argument("--metrics", help="analyse an existing metrics.jsonl instead of running")
    args = parser.parse_args()
    metrics = args.metrics or run_quickstart(args.steps, args.exp_dir, args.shape)
    rows = step_rows(metrics)
    if not rows:
        print(f"no step metrics in {metrics}", file=sys.stderr)
        return 1
    print_table(rows)
    fraction = overhead_fraction(rows)
    steady = rows[1:] or rows
    median = sorted(r["wall"] for r in steady)[len(steady) // 2]
    samples_per_s = (steady[0]["samples"] or 0.0) / median
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"shape": args.shape, "rows": rows, "overhead_fraction": fraction, "median_step_s": median,
                   "samples_per_s": samples_per_s, "steady_state_steps": len(steady)}, f, indent=2)
    print(f"median step {median:.3f} s, {samples_per_s:.1f} samples/s")
    print(f"overhead_fraction={fraction:.3f} samples_per_s={samples_per_s:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
