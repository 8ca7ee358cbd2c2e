"""Colocate on one GPU: what the engines and the trainer hold in each phase (GPU only).

Builds a randomly initialised Qwen3-0.6B-shaped model (28 layers, hidden 1024, GQA 16/8,
vocab 151936, bf16; the quickstart's tokenizer and prompts), runs a few colocate GRPO steps
with `relax-train` on one GPU (actor + rollout engine sharing it, the trainer offloading
during rollout, the engine releasing during training) and reads the step metrics:

- rollout_gpu_used: the whole GPU's memory in use at the end of generation (engine at work,
  trainer offloaded)
- engine_released: what the engine's allocator still holds after releasing
- trainer_offloaded: what the trainer's allocator still holds after offloading
- train_peak: the trainer's peak allocation in a training pass; train_gpu_used: the whole GPU
  at the end of training (engine released)
- per process (nvidia-smi twice a second): the least and most each engine and trainer rank held,
  CUDA context included: the engine's least is what it keeps while released

Prints a table and writes JSON (`--out`). Usage: python3 bench/gpu_colocate_memory.py --out FILE
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KEYS = ("memory/rollout_gpu_used_gib", "memory/engine_released_gib", "memory/trainer_offloaded_gib",
        "memory/rollout_phase_gpu_used_gib", "memory/train_peak_gib", "memory/train_gpu_used_gib",
        "time/offload_train", "time/onload_train", "time/step")


def build_model(work: str) -> str:
    import torch
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    path = os.path.join(work, "qwen3-0.6b-shape")
    if os.path.exists(os.path.join(path, "config.json")):
        return path
    tokenizer = AutoTokenizer.from_pretrained(os.path.join(work, "models", "tiny-qwen3-sft"))
    config = Qwen3Config(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                         num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=4096,
                         tie_word_embeddings=True, rope_theta=1_000_000.0, torch_dtype="bfloat16",
                         pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                         bos_token_id=tokenizer.bos_token_id)
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


class ProcessMemory:
    """Samples `nvidia-smi --query-compute-apps` twice a second: per process (engine, trainer
    rank), the least and most GPU memory it held, CUDA context included."""

    def __init__(self) -> None:
        import threading

        self.seen: dict[str, list[float]] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)
        self.thread.start()

    @staticmethod
    def kind(pid: str) -> str:
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode()
        except OSError:
            return f"pid {pid}"
        if "relax.backends.hf.server" in cmd:
            return "engine"
        return "trainer" if "ray::Trainer" in cmd else f"pid {pid}"

    def loop(self) -> None:
        while not self.stop.wait(0.5):
            out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                                  "--format=csv,noheader,nounits"], capture_output=True, text=True).stdout
            for line in out.strip().splitlines():
                pid, mib = [x.strip() for x in line.split(",")]
                key = f"{self.kind(pid)} ({pid})"
                lo, hi = self.seen.get(key, [float("inf"), 0.0])
                self.seen[key] = [min(lo, float(mib) / 1024), max(hi, float(mib) / 1024)]

    def finish(self) -> dict[str, dict[str, float]]:
        self.stop.set()
        self.thread.join()
        return {k: {"min_gib": round(lo, 3), "max_gib": round(hi, 3)} for k, (lo, hi) in self.seen.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", default="/tmp/relax-colocate-bench")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--out", default=os.path.join(REPO, "bench", "results", "gpu_colocate_memory.json"))
    args = parser.parse_args()
    env = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
    subprocess.run([sys.executable, "-m", "examples.tiny_math.prepare", "--out-dir", args.work], check=True,
                   cwd=REPO, env=env)
    model = build_model(args.work)
    run_dir = os.path.join(args.work, "run")
    start = time.perf_counter()
    sampler = ProcessMemory()
    subprocess.run([sys.executable, "relax/entrypoints/train.py", "--colocate", "--resource",
                    '{"actor": [1, 1], "rollout": [1, 1]}', "--hf-checkpoint", model, "--exp-dir", run_dir,
                    "--prompt-data", os.path.join(args.work, "data", "train.jsonl"), "--input-key", "prompt",
                    "--label-key", "label", "--apply-chat-template", "--rm-type", "math",
                    "--num-rollout", str(args.steps), "--rollout-batch-size", "32", "--n-samples-per-prompt", "8",
                    "--rollout-max-response-len", "128", "--global-batch-size", "256", "--bf16",
                    "--use-dynamic-batch-size", "--max-tokens-per-gpu", "4096", "--lr", "1e-6"],
                   check=True, cwd=REPO, env=env)
    wall = time.perf_counter() - start
    processes = sampler.finish()
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        steps = [json.loads(line) for line in f]
    rows = [{k: round(s[k], 3) for k in KEYS if k in s} | {"step": s["step"]} for s in steps]
    import torch

    result = {"bench": "gpu_colocate_memory", "device": torch.cuda.get_device_name(0),
              "gpu_total_gib": round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1),
              "model": "Qwen3-0.6B shape (random init, bf16)", "steps": rows, "processes": processes,
              "wall_seconds": round(wall, 1)}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    print(f"\n{result['device']} ({result['gpu_total_gib']} GiB), {result['model']}, wall {wall:.0f}s")
    print(f"{'step':>4} " + " ".join(f"{k.split('/')[-1]:>26}" for k in KEYS))
    for row in rows:
        print(f"{row['step']:>4} " + " ".join(f"{row.get(k, float('nan')):>26.3f}" for k in KEYS))
    print("GPU memory per process (nvidia-smi, CUDA context included), least and most over the run:")
    for name, m in sorted(processes.items()):
        print(f"  {name:<24} min {m['min_gib']:7.3f} GiB   max {m['max_gib']:7.3f} GiB")


if __name__ == "__main__":
    main()
