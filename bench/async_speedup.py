"""Fully async vs colocate on the same rollout-heavy tiny-model workload and the same CPUs.

The workload is RL with a verifier that takes time, as code-execution sandboxes, remote reward
models and LLM judges do: the policy thinks before it answers, with long-tailed response lengths
(`thinking_policy`: mean ~55 tokens, the longest of a step near --max-response-len), and each
sample's reward arrives `--reward-latency` seconds (default 1.0) after it is generated
(`bench/sandbox_reward.py`: the built-in math grade behind an `asyncio.sleep`, no CPU). That
makes rollout ~60 % of a colocate step, as in real RL (on GPUs the share comes from decoding
and its long tail; on this 2-core CPU, decoding alone is ~40 %). `--reward-latency 0` is the
pure-compute variant (see docs/fully-async.md for both results).

Both runs train the same number of samples (steps x prompts x n) with the same seed; eval and
checkpoints are off. The CPU budget is the same machine for both:
  colocate   - phases take turns, each gets every core: 2 engines during rollout, then 2
               training ranks (reference forward, old log-probs, optimizer) while they sleep;
  fully async - roles run at once and share the cores: 1 engine keeps generating (the next
               step's requests fill the batch while a step's longest samples finish) while the
               actor, ActorFwd and Reference (1 rank each) train and score behind it, at most
               --staleness steps ahead.
Every torch process uses one thread (`--engine-threads 1`), so "cores" means processes.
Wall time is the training loop (sum of `time/step`); deployment is reported but not compared.

    python3 bench/async_speedup.py [--steps 16] [--staleness 2] [--reward-latency 1.0]
                                   [--out bench/results/async_speedup.json]

Prints a table (wall, rollout/train/sync seconds, the rollout's share of a colocate step, idle
fraction of the rollout engines and of the actor) and ends with
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
sys.path.insert(0, ROOT)  # run as `python3 bench/<name>.py`: the repo root (examples/, relax/) imports

def mode_args(mode: str, args: argparse.Namespace) -> list[str]:
    """Colocate: every phase on both cores in turn. Fully async: the roles at once."""
    if mode == "colocate":
        return ["--colocate", "--resource", '{"actor": [1, 2], "rollout": [1, 2], "reference": [1, 2]}']
    resource = {"actor": [1, args.async_actor_ranks], "rollout": [1, args.async_engines], "reference": [1, 1],
                "actor_fwd": [1, 1],
                "advantages": [1, 0]}
    return ["--fully-async", "--max-staleness", str(args.staleness), "--resource", json.dumps(resource)]


def thinking_policy(model_dir: str, *, mean_think: int, hidden_size: int, num_layers: int, seed: int,
                    steps: int = 150) -> str:
    """A tiny policy that thinks before it answers: its responses are k digit tokens (k drawn
    from an exponential of mean `mean_think`), then the quickstart's `The largest is \\boxed{d}.`.

    Real reasoning traces have this shape: most are short, a few are many times longer. A
    synchronous step waits for its longest sample while the engines' batches drain; that tail
    (and the engines sitting out the training phase) is the time fully async mode wins back.
    Trained here in `steps` SFT steps from a fresh model of the given size (cached)."""
    out = os.path.join(model_dir, "models", f"tiny-qwen3-think{mean_think}-h{hidden_size}-l{num_layers}")
    if os.path.exists(os.path.join(out, "config.json")):
        return out
    import random

    import torch
    from transformers import AutoTokenizer

    from examples.tiny_math.sft import prompt_ids, response_ids, sft_step
    from examples.tiny_math.task import response_text
    from relax.utils.tiny_model import build_tiny_qwen3, save_tiny_model

    tokenizer = AutoTokenizer.from_pretrained(os.path.join(model_dir, "models", "tiny-qwen3-sft"))
    model = build_tiny_qwen3(tokenizer, hidden_size=hidden_size, num_layers=num_layers, seed=seed)
    with open(os.path.join(model_dir, "data", "train.jsonl")) as f:
        rows = [json.loads(line) for _, line in zip(range(4096), f)]
    rng = random.Random(seed)
    torch.manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    model.train()
    for _ in range(steps):
        examples = []
        for row in rng.sample(rows, 32):
            think = " ".join(str(rng.randint(0, 9)) for _ in range(int(rng.expovariate(1 / mean_think))))
            answer = response_ids(tokenizer, f"{think} {response_text(row['label'])}")
            examples.append((prompt_ids(tokenizer, row), answer))
        sft_step(model, optimizer, examples, tokenizer.pad_token_id)
    model.eval()
    save_tiny_model(model, tokenizer, out)
    return out


def reward_args(args: argparse.Namespace) -> list[str]:
    """The math reward, behind `--reward-latency` seconds of sandbox latency per sample when > 0
    (`bench/sandbox_reward.py`; the latency reaches it as `args.reward_latency_s`)."""
    if args.reward_latency <= 0:
        return ["--rm-type", "math"]
    path = os.path.join(args.exp_dir, "sandbox.yaml")
    os.makedirs(args.exp_dir, exist_ok=True)
    with open(path, "w") as f:
        f.write(f"reward_latency_s: {args.reward_latency}\n")
    return ["--custom-rm-path", "bench.sandbox_reward.sandboxed_math", "--custom-config-path", path]


def workload(model_dir: str, policy: str, args: argparse.Namespace) -> list[str]:
    """Rollout-heavy, as in real RL: long-tailed responses, one optimizer step per rollout."""
    steps, seed, samples = args.steps, args.seed, args.rollout_batch_size * args.n_samples_per_prompt
    return [
        "--hf-checkpoint", policy, "--ref-load", policy,
        "--prompt-data", f"{model_dir}/data/train.jsonl", "--input-key", "prompt", "--label-key", "label",
        "--apply-chat-template", *reward_args(args), "--rollout-shuffle", "--rollout-seed", str(seed),
        "--num-rollout", str(steps), "--rollout-batch-size", str(args.rollout_batch_size),
        "--n-samples-per-prompt", str(args.n_samples_per_prompt),
        "--rollout-max-response-len", str(args.max_response_len), "--rollout-temperature", "1.0",
        "--global-batch-size", str(samples),
        "--advantage-estimator", "grpo", "--use-kl-loss", "--kl-loss-coef", "0.05", "--kl-loss-type", "low_var_kl",
        "--lr", "1e-4", "--seed", str(seed), "--use-dynamic-batch-size", "--max-tokens-per-gpu", "8192",
        "--engine-threads", "1", "--progress-bar", "false",
        # A step's worth of requests decode at once per engine (colocate: 2 x 64 = the whole step);
        # later requests queue and join as earlier ones finish (continuous batching).
        "--sglang-max-running-requests", "64",
    ]


def step_rows(metrics: str, steps: int, mode: str) -> list[dict]:
    """The training steps' rows of a run's metrics.jsonl (eval rows have no step time); all `steps` of them."""
    with open(metrics) as f:
        rows = [r for r in map(json.loads, f) if "time/step" in r]
    if len(rows) != steps:
        raise RuntimeError(f"{mode}: expected {steps} step rows in {metrics}, found {len(rows)}")
    return rows


def run_mode(mode: str, args: argparse.Namespace, common: list[str]) -> dict:
    exp_dir = os.path.join(args.exp_dir, mode)
    metrics = os.path.join(exp_dir, "metrics.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    extra = mode_args(mode, args)
    start = time.perf_counter()
    subprocess.run([sys.executable, "relax/entrypoints/train.py", *common, *extra, "--exp-dir", exp_dir],
                   cwd=ROOT, check=True, stdout=subprocess.DEVNULL if args.quiet else None)
    process_wall = time.perf_counter() - start
    rows = step_rows(metrics, args.steps, mode)
    total = lambda key: sum(r.get(key, 0.0) for r in rows)  # noqa: E731
    wall = total("time/step")
    return {
        "mode": mode, "wall": wall, "process_wall": process_wall, "startup": process_wall - wall,
        "rollout": total("time/rollout"), "generate_compute": total("compute/generate_seconds"),
        "train_compute": total("compute/train_seconds"), "sync": total("weight_sync/seconds"),
        # Colocate: the share of the step spent generating (real RL: 60-70 %).
        "rollout_share": total("time/rollout") / wall,
        "rollout_idle": 1 - total("compute/generate_seconds") / wall,
        "actor_idle": 1 - total("compute/train_seconds") / wall,
        "samples": int(total("rollout/num_samples")),
        "max_lag": max(r.get("train/max_version_lag", 0.0) for r in rows),
        "reward_mean": total("rollout/reward_mean") / len(rows),
    }


def print_table(results: list[dict]) -> None:
    cols = ("wall", "startup", "rollout", "rollout_share", "generate_compute", "train_compute", "sync",
            "rollout_idle", "actor_idle", "samples", "max_lag")
    print(f"{'mode':>12} " + " ".join(f"{c:>16}" for c in cols))
    for r in results:
        cells = [f"{r[c]:>16.0%}" if c.endswith(("idle", "share")) else f"{r[c]:>16.3f}" if isinstance(r[c], float)
                 else f"{r[c]:>16}" for c in cols]
        print(f"{r['mode']:>12} " + " ".join(cells))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--staleness", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--exp-dir", default=os.path.join(ROOT, "outputs", "bench-async-speedup"))
    parser.add_argument("--model-dir", help="a prepared examples/tiny_math dir (default: prepare under --exp-dir)")
    parser.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "async_speedup.json"))
    parser.add_argument("--quiet", action="store_true", help="hide the runs' own output")
    parser.add_argument("--mean-think", type=int, default=24,
                        help="mean number of digits the policy writes before answering (exponential)")
    parser.add_argument("--hidden-size", type=int, default=64, help="policy width")
    parser.add_argument("--num-layers", type=int, default=4, help="policy depth")
    parser.add_argument("--max-response-len", type=int, default=192)
    parser.add_argument("--rollout-batch-size", type=int, default=4, help="prompts per step")
    parser.add_argument("--n-samples-per-prompt", type=int, default=8)
    parser.add_argument("--reward-latency", type=float, default=1.0,
                        help="seconds a sample's reward takes (a sandbox / remote judge; no CPU); 0 = the plain "
                             "math reward (pure compute)")
    parser.add_argument("--only", choices=("colocate", "fully_async"), help="run one mode, print its row")
    parser.add_argument("--async-engines", type=int, default=1, help="rollout engines in fully-async mode")
    parser.add_argument("--async-actor-ranks", type=int, default=1, help="actor ranks in fully-async mode")
    args = parser.parse_args()
    model_dir = args.model_dir or args.exp_dir
    subprocess.run([sys.executable, "-m", "examples.tiny_math.prepare", "--out-dir", model_dir, "--seed",
                    str(args.seed)], cwd=ROOT, check=True)
    policy = thinking_policy(model_dir, mean_think=args.mean_think, hidden_size=args.hidden_size,
                             num_layers=args.num_layers, seed=args.seed)
    common = workload(model_dir, policy, args)
    if args.only:  # a quick look at one mode (no speedup line)
        print_table([run_mode(args.only, args, common)])
        return 0
    results = [run_mode(mode, args, common) for mode in ("colocate", "fully_async")]
    print_table(results)
    colocate, fully_async = results
    if colocate["samples"] != fully_async["samples"]:
        raise RuntimeError(f"trained samples differ: {colocate['samples']} vs {fully_async['samples']}")
    speedup = colocate["wall"] / fully_async["wall"]
    staleness_seen = int(fully_async["max_lag"])
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"results": results, "policy": os.path.basename(policy), "reward_latency_s": args.reward_latency,
                   "async_speedup": speedup, "max_staleness_seen": staleness_seen,
                   "bound": args.staleness, "cpu_count": os.cpu_count(),
                   "affinity": sorted(os.sched_getaffinity(0))}, f, indent=2)
    print(f"async_speedup={speedup:.2f} max_staleness_seen={staleness_seen} bound={args.staleness}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
