"""Fully async vs colocate on the same GPUs, the same samples and the same seed.

The workload is decode-dominated RL on a Qwen3-0.6B-shaped policy (random weights, bf16 engines,
float32 master weights with bf16 compute in the trainer), GRPO with the rollout's log-probs as
the old policy (no Reference, no ActorFwd: the same algorithm in both modes). Response lengths
are long-tailed and identical in both runs (`bench/long_tail_generate.py`: exponential of mean
`--mean-response` tokens, capped at `--max-response-len`), as reasoning traces are; the reward
is the built-in math grade (zero on random text; the step's compute is what is measured).

  colocate    - `--colocate`: every GPU holds one actor rank and one engine; the engines
                generate the step, release their memory, the actor ranks onload, train and push,
                the engines take the weights back. A step waits for its longest response.
  fully async - `--fully-async --max-staleness <bound>`: the actor ranks own the first
                `--async-actor-gpus` GPUs and the engines the rest; generation never stops for
                training (the next step's requests fill the batch while the longest finish) and
                weights are pushed in the background, at most `bound` versions behind.

  colocate, no offload - the same with `--no-offload-train`: the actor ranks keep their state on
                the GPU while the engines generate (where memory allows: no offload at all).

Wall time is the training loop (sum of `time/step`), deployment excluded; the speedup is taken in
the steady state, over the second half of the steps (the first half fills fully async's pipeline
and warms both modes up), against the faster colocate row. The per-role table gives, over that
wall time, each role's busy share (engines: the busiest engine's decode
seconds; actor: its forward/backward/optimizer seconds), the actor's wait for rows, and the
weight sync seconds.

    python3 bench/gpu_async_speedup.py [--steps 16] [--staleness 2] [--mean-response 96]
        [--max-response-len 512] [--out bench/results/gpu_async_speedup.json]
    python3 bench/gpu_async_speedup.py --cpu --steps 2 ...   # the same runs on the CPU (tiny shape)

Needs two or more GPUs (or `--cpu`). The last line is
`gpu_async_speedup=<best colocate steady wall / async steady wall> max_staleness_seen=<k> bound=<b>`
(the goal, issue 29: >= 2.0 on two GPUs at this long-tailed workload).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # run as `python3 bench/<name>.py`: the repo root imports


def write_policy(path: str, shape: str, seed: int) -> str:
    """A random Qwen3 of `shape` (bench/weight_sync.py's shapes) with the tiny word tokenizer,
    saved in bf16 (the trainer loads float32 master weights from it)."""
    if os.path.exists(os.path.join(path, "config.json")):
        return path
    import torch
    from transformers import AutoModelForCausalLM

    from bench.weight_sync import model_config
    from relax.backends.hf.tiny_model import build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    config = model_config(shape)
    config.eos_token_id, config.pad_token_id = tokenizer.eos_token_id, tokenizer.pad_token_id
    torch.manual_seed(seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def write_prompts(path: str, rows: int, prompt_words: int, seed: int) -> str:
    """Prompts of `prompt_words` words from the tokenizer's vocabulary (one token each)."""
    from relax.backends.hf.tiny_model import WORDS

    rng = random.Random(seed)
    with open(path, "w") as f:
        for _ in range(rows):
            f.write(json.dumps({"prompt": " ".join(rng.choice(WORDS) for _ in range(prompt_words)),
                                "label": str(rng.randint(0, 9))}) + "\n")
    return path


MODES = ("colocate", "colocate_no_offload", "fully_async")


def mode_args(mode: str, args: argparse.Namespace) -> list[str]:
    if mode.startswith("colocate"):
        resource = {"actor": [1, args.gpus], "rollout": [1, args.gpus]}
        return ["--colocate", "--resource", json.dumps(resource)] + (
            ["--no-offload-train"] if mode == "colocate_no_offload" else [])
    engines = args.gpus - args.async_actor_gpus
    resource = {"actor": [1, args.async_actor_gpus], "rollout": [1, engines], "advantages": [1, 0]}
    return ["--fully-async", "--max-staleness", str(args.staleness), "--resource", json.dumps(resource)]


def workload(policy: str, prompts: str, config_path: str, args: argparse.Namespace) -> list[str]:
    samples = args.rollout_batch_size * args.n_samples_per_prompt
    flags = [
        "--hf-checkpoint", policy, "--prompt-data", prompts, "--input-key", "prompt", "--label-key", "label",
        "--rm-type", "math", "--rollout-shuffle", "--rollout-seed", str(args.seed),
        "--custom-generate-function-path", "bench.long_tail_generate.generate", "--custom-config-path", config_path,
        "--num-rollout", str(args.steps), "--rollout-batch-size", str(args.rollout_batch_size),
        "--n-samples-per-prompt", str(args.n_samples_per_prompt),
        "--rollout-max-response-len", str(args.max_response_len), "--rollout-temperature", "1.0",
        "--global-batch-size", str(samples), "--advantage-estimator", "grpo", "--use-rollout-logprobs",
        "--lr", "1e-6", "--seed", str(args.seed), "--use-dynamic-batch-size",
        "--max-tokens-per-gpu", str(args.max_tokens_per_gpu), "--progress-bar", "false",
        "--sglang-max-running-requests", str(args.max_running_requests), "--train-backend", args.train_backend,
    ]
    if not args.cpu:
        flags += ["--bf16", "--sglang-dtype", "bfloat16"]
    return flags


def run_mode(mode: str, args: argparse.Namespace, common: list[str]) -> dict:
    from bench.async_speedup import step_rows

    exp_dir = os.path.join(args.exp_dir, mode)
    metrics = os.path.join(exp_dir, "metrics.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    start = time.perf_counter()
    log = os.path.join(args.exp_dir, f"{mode}.log")
    with open(log, "w") as out:
        proc = subprocess.run([sys.executable, "relax/entrypoints/train.py", *common, *mode_args(mode, args),
                               "--exp-dir", exp_dir], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        with open(log) as f:
            tail = f.read()[-6000:]
        raise RuntimeError(f"{mode} run failed (exit {proc.returncode}); the end of {log}:\n{tail}")
    process_wall = time.perf_counter() - start
    rows = step_rows(metrics, args.steps, mode)
    total = lambda key: sum(r.get(key, 0.0) for r in rows)  # noqa: E731
    wall = total("time/step")
    return {
        "mode": mode, "wall": wall, "startup": process_wall - wall,
        "steady_wall": sum(r["time/step"] for r in rows[len(rows) // 2:]),  # the second half of the steps
        "median_step": sorted(r["time/step"] for r in rows)[len(rows) // 2],
        "rollout_busy": total("compute/generate_seconds") / wall, "actor_busy": total("compute/train_seconds") / wall,
        "actor_wait": total("time/wait_rows") / wall, "sync_seconds": total("weight_sync/seconds"),
        "offload_seconds": total("time/offload_train") + total("time/onload_train"),
        "samples": int(total("rollout/num_samples")),
        "max_lag": max(r.get("train/max_version_lag", 0.0) for r in rows),
    }


def print_table(results: list[dict]) -> None:
    print(f"{'mode':>20} {'wall s':>8} {'steady s':>8} {'step s':>7} {'engine busy':>11} {'engine idle':>11}"
          f" {'actor busy':>10} {'actor idle':>10} {'actor wait':>10} {'sync s':>7} {'offload s':>9} {'samples':>7}"
          f" {'lag':>4}")
    for r in results:
        print(f"{r['mode']:>20} {r['wall']:>8.1f} {r['steady_wall']:>8.1f} {r['median_step']:>7.2f}"
              f" {r['rollout_busy']:>11.0%}"
              f" {1 - r['rollout_busy']:>11.0%} {r['actor_busy']:>10.0%} {1 - r['actor_busy']:>10.0%}"
              f" {r['actor_wait']:>10.0%} {r['sync_seconds']:>7.2f} {r['offload_seconds']:>9.2f} {r['samples']:>7}"
              f" {int(r['max_lag']):>4}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--staleness", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--shape", default="0.6b", help="policy shape (bench/weight_sync.py's shapes)")
    parser.add_argument("--gpus", type=int, default=2, help="GPUs both modes run on")
    parser.add_argument("--async-actor-gpus", type=int, default=1, help="of --gpus, the actor's in fully async")
    parser.add_argument("--rollout-batch-size", type=int, default=32, help="prompts per step")
    parser.add_argument("--n-samples-per-prompt", type=int, default=8)
    parser.add_argument("--mean-response", type=float, default=96, help="mean response tokens (exponential)")
    parser.add_argument("--max-response-len", type=int, default=512)
    parser.add_argument("--prompt-words", type=int, default=48)
    parser.add_argument("--max-running-requests", type=int, default=256, help="decode batch per engine")
    parser.add_argument("--max-tokens-per-gpu", type=int, default=16384)
    parser.add_argument("--train-backend", default="auto", choices=("auto", "fsdp", "megatron"),
                        help="the actor's training backend in both modes (auto: megatron where installed, on GPUs)")
    parser.add_argument("--cpu", action="store_true", help="run on the CPU (a tiny policy; checks the bench)")
    parser.add_argument("--only", choices=MODES, help="run one mode, print its row")
    parser.add_argument("--exp-dir", default=os.path.join(ROOT, "outputs", "bench-gpu-async-speedup"))
    parser.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "gpu_async_speedup.json"))
    args = parser.parse_args()
    device = "cpu"
    if args.cpu:
        args.shape = "tiny" if args.shape == "0.6b" else args.shape
    else:
        import torch

        found = torch.cuda.device_count()
        if found < args.gpus or args.gpus < 2:
            raise SystemExit(f"gpu_async_speedup needs --gpus >= 2 GPUs (asked {args.gpus}, found {found}); "
                             "--cpu runs it on the CPU")
        device = f"{args.gpus}x {torch.cuda.get_device_name(0)}"
    os.makedirs(args.exp_dir, exist_ok=True)
    policy = write_policy(os.path.join(args.exp_dir, f"policy-{args.shape}"), args.shape, args.seed)
    prompts = write_prompts(os.path.join(args.exp_dir, "prompts.jsonl"),
                            args.steps * args.rollout_batch_size * 2, args.prompt_words, args.seed)
    config_path = os.path.join(args.exp_dir, "long_tail.yaml")
    with open(config_path, "w") as f:
        f.write(f"long_tail_mean: {args.mean_response}\nlong_tail_seed: {args.seed}\n")
    common = workload(policy, prompts, config_path, args)
    modes = [args.only] if args.only else list(MODES)
    results = []
    for mode in modes:  # each mode's row as it ends: a run cut short still shows the modes it finished
        results.append(run_mode(mode, args, common))
        print("mode " + json.dumps(results[-1]), flush=True)
    print_table(results)
    if args.only:
        return 0
    by_mode = {r["mode"]: r for r in results}
    fully_async = by_mode["fully_async"]
    if len({r["samples"] for r in results}) != 1:
        raise RuntimeError(f"trained samples differ: {[(r['mode'], r['samples']) for r in results]}")
    colocate = min((r for r in results if r["mode"] != "fully_async"), key=lambda r: r["steady_wall"])
    speedup = colocate["steady_wall"] / fully_async["steady_wall"]
    staleness_seen = int(fully_async["max_lag"])
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"device": device, "args": vars(args), "results": results, "gpu_async_speedup": speedup,
                   "against": colocate["mode"], "whole_run_speedup": colocate["wall"] / fully_async["wall"],
                   "goal": 2.0, "max_staleness_seen": staleness_seen, "bound": args.staleness}, f, indent=1)
    print(f"gpu_async_speedup={speedup:.2f} max_staleness_seen={staleness_seen} bound={args.staleness}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
