"""Fully async vs colocate on the same rollout-heavy tiny-model workload and the same CPUs.

Both runs train the same number of samples (steps x rollout batch x n) from the same SFT
checkpoint (examples/tiny_math/prepare.py) with the same seed; eval and checkpoints are off.
The CPU budget is the same machine for both:
  colocate   - phases take turns, each gets every core: 2 engines during rollout, then 2
               training ranks (reference forward, old log-probs, optimizer) while they sleep;
  fully async - roles run at once and share the cores: 2 engines keep generating while the
               actor (1 rank), ActorFwd and Reference (1 rank each) train and score behind them,
               at most --staleness steps ahead.
Every torch process uses one thread (`--engine-threads 1`), so "cores" means processes.
Wall time is the training loop (sum of `time/step`); deployment is reported but not compared.

    python3 bench/async_speedup.py [--steps 8] [--staleness 2] [--out bench/results/async_speedup.json]

Prints a table (wall, rollout/train/sync seconds, idle fraction of the rollout engines and of
the actor) and ends with
`async_speedup=<colocate_time/async_time> max_staleness_seen=<k> bound=<b>`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

MODES = {
    "colocate": ["--colocate", "--resource",
                 '{"actor": [1, 2], "rollout": [1, 2], "reference": [1, 2]}'],
    "fully_async": ["--fully-async", "--resource",
                    '{"actor": [1, 1], "rollout": [1, 2], "reference": [1, 1], "actor_fwd": [1, 1], '
                    '"advantages": [1, 0]}'],
}


def untrained_policy(model_dir: str) -> str:
    """The quickstart architecture, freshly initialised: it rarely emits EOS, so every response
    runs to --rollout-max-response-len and decoding dominates, as it does in real RL."""
    from transformers import AutoTokenizer

    from relax.utils.tiny_model import build_tiny_qwen3, save_tiny_model

    out = os.path.join(model_dir, "models", "tiny-qwen3-untrained")
    if not os.path.exists(os.path.join(out, "config.json")):
        tokenizer = AutoTokenizer.from_pretrained(os.path.join(model_dir, "models", "tiny-qwen3-sft"))
        save_tiny_model(build_tiny_qwen3(tokenizer, hidden_size=128, num_layers=4), tokenizer, out)
    return out


def workload(model_dir: str, policy: str, steps: int, seed: int) -> list[str]:
    """Rollout-heavy, as in real RL: responses of up to 48 tokens, one optimizer step per rollout."""
    return [
        "--hf-checkpoint", policy, "--ref-load", policy,
        "--prompt-data", f"{model_dir}/data/train.jsonl", "--input-key", "prompt", "--label-key", "label",
        "--apply-chat-template", "--rm-type", "math", "--rollout-shuffle", "--rollout-seed", str(seed),
        "--num-rollout", str(steps), "--rollout-batch-size", "16", "--n-samples-per-prompt", "8",
        "--rollout-max-response-len", "48", "--rollout-temperature", "1.0", "--global-batch-size", "128",
        "--advantage-estimator", "grpo", "--use-kl-loss", "--kl-loss-coef", "0.05", "--kl-loss-type", "low_var_kl",
        "--lr", "1e-4", "--seed", str(seed), "--use-dynamic-batch-size", "--max-tokens-per-gpu", "8192",
        "--engine-threads", "1", "--progress-bar", "false",
        # Few requests in flight per engine: decoding runs in many small waves, as long
        # generations do on a GPU engine, and the engines' time dominates the step.
        "--sglang-max-running-requests", "4",
    ]


def run_mode(mode: str, args: argparse.Namespace, common: list[str]) -> dict:
    exp_dir = os.path.join(args.exp_dir, mode)
    metrics = os.path.join(exp_dir, "metrics.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    extra = MODES[mode] + (["--max-staleness", str(args.staleness)] if mode == "fully_async" else [])
    start = time.perf_counter()
    subprocess.run([sys.executable, "relax/entrypoints/train.py", *common, *extra, "--exp-dir", exp_dir],
                   cwd=ROOT, check=True, stdout=subprocess.DEVNULL if args.quiet else None)
    process_wall = time.perf_counter() - start
    with open(metrics) as f:
        rows = [r for r in map(json.loads, f) if "time/step" in r]
    if len(rows) != args.steps:
        raise RuntimeError(f"{mode}: expected {args.steps} step rows in {metrics}, found {len(rows)}")
    total = lambda key: sum(r.get(key, 0.0) for r in rows)  # noqa: E731
    wall = total("time/step")
    return {
        "mode": mode, "wall": wall, "process_wall": process_wall, "startup": process_wall - wall,
        "rollout": total("time/rollout"), "generate_compute": total("compute/generate_seconds"),
        "train_compute": total("compute/train_seconds"), "sync": total("weight_sync/seconds"),
        "rollout_idle": 1 - total("compute/generate_seconds") / wall,
        "actor_idle": 1 - total("compute/train_seconds") / wall,
        "samples": int(total("rollout/num_samples")),
        "max_lag": max(r.get("train/max_version_lag", 0.0) for r in rows),
        "reward_mean": total("rollout/reward_mean") / len(rows),
    }


def print_table(results: list[dict]) -> None:
    cols = ("wall", "startup", "rollout", "generate_compute", "train_compute", "sync", "rollout_idle",
            "actor_idle", "samples", "max_lag")
    print(f"{'mode':>12} " + " ".join(f"{c:>16}" for c in cols))
    for r in results:
        cells = [f"{r[c]:>16.0%}" if c.endswith("idle") else f"{r[c]:>16.3f}" if isinstance(r[c], float)
                 else f"{r[c]:>16}" for c in cols]
        print(f"{r['mode']:>12} " + " ".join(cells))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--staleness", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--exp-dir", default=os.path.join(ROOT, "outputs", "bench-async-speedup"))
    parser.add_argument("--model-dir", help="a prepared examples/tiny_math dir (default: prepare under --exp-dir)")
    parser.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "async_speedup.json"))
    parser.add_argument("--quiet", action="store_true", help="hide the runs' own output")
    parser.add_argument("--policy", choices=("untrained", "sft"), default="untrained",
                        help="untrained: long responses, rollout-heavy (default); sft: the quickstart policy, "
                             "~10-token answers, training-heavy")
    args = parser.parse_args()
    model_dir = args.model_dir or args.exp_dir
    subprocess.run([sys.executable, "-m", "examples.tiny_math.prepare", "--out-dir", model_dir, "--seed",
                    str(args.seed)], cwd=ROOT, check=True)
    policy = untrained_policy(model_dir) if args.policy == "untrained" else f"{model_dir}/models/tiny-qwen3-sft"
    common = workload(model_dir, policy, args.steps, args.seed)
    results = [run_mode(mode, args, common) for mode in ("colocate", "fully_async")]
    print_table(results)
    colocate, fully_async = results
    if colocate["samples"] != fully_async["samples"]:
        raise RuntimeError(f"trained samples differ: {colocate['samples']} vs {fully_async['samples']}")
    speedup = colocate["wall"] / fully_async["wall"]
    staleness_seen = int(fully_async["max_lag"])
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"results": results, "policy": args.policy, "async_speedup": speedup, "max_staleness_seen": staleness_seen,
                   "bound": args.staleness, "cpu_count": os.cpu_count(),
                   "affinity": sorted(os.sched_getaffinity(0))}, f, indent=2)
    print(f"async_speedup={speedup:.2f} max_staleness_seen={staleness_seen} bound={args.staleness}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
