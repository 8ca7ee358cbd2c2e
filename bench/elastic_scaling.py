"""Elastic rollout scaling on this machine: throughput before/after engines join mid-run, and the
autoscaler's fleet size over a run whose rollout cost changes.

Both parts drive a real `EngineFleet` of `hf` engines (random tiny Qwen3, one torch thread each) through
the same `FleetScaler` the run's API uses (`LocalFleetOps`: the new engines load the same checkpoint, so
the weight check passes without a push; no Ray).

1. throughput: `--concurrency` clients send generate requests (`--max-new-tokens`, ignore_eos) through the
   router without pause; after `--phase-s` seconds on one engine, `--add` engines are added (scale-out)
   while the load runs; samples/s is measured over the `--phase-s` seconds before the request and after
   the operation ended.
2. autoscaler: a synthetic RL loop: each step generates `--batch` samples through the router, then
   "trains" for `--train-s` seconds; the trainer's wait for samples is the step's rollout share. The
   rollout cost changes mid-run (cheap -> `--expensive-tokens` -> cheap); after each step the autoscaler
   (`trainer_wait`, min 1 / max `--max-engines`, cooldown `--cooldown-s`) decides and acts.

    python3 bench/elastic_scaling.py [--phase-s 20] [--concurrency 16] [--max-new-tokens 64] [--add 1]
        [--steps 30] [--batch 16] [--train-s 1.0] [--cheap-tokens 4] [--expensive-tokens 64]
        [--hidden-size 512] [--num-layers 4]
        [--out bench/results/elastic_scaling.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # run as `python3 bench/<name>.py`: the repo root (relax/) imports


async def new_fleet(model_dir: str, log_dir: str):
    from relax.engine.elastic.local_ops import LocalFleetOps
    from relax.engine.elastic.scaler import FleetScaler, ScalerSettings
    from relax.engine.fleet import EngineFleet, FleetSpec

    fleet = EngineFleet(FleetSpec(name="rollout", backend="hf", model_path=model_dir, log_dir=log_dir, threads=1,
                                  startup_timeout=300))
    await fleet.start(1)
    return fleet, FleetScaler(LocalFleetOps(fleet), ScalerSettings(scale_out_timeout=300, drain_timeout=10))


def request(tokens: int, i: int) -> dict:
    return {"input_ids": [5 + i % 50, 6, 7, 8], "sampling_params": {"temperature": 1.0, "max_new_tokens": tokens,
                                                                     "ignore_eos": True}}


async def until_done(op) -> None:
    await asyncio.wait([op.task])


async def throughput(model_dir: str, log_dir: str, a: argparse.Namespace) -> dict:
    from relax.utils.http_utils import post

    fleet, scaler = await new_fleet(model_dir, log_dir)
    done: list[float] = []  # completion times
    stop = asyncio.Event()

    async def client(c: int) -> None:
        i = 0
        while not stop.is_set():
            await post(fleet.router_url + "/generate", request(a.max_new_tokens, c * 1000 + i))
            done.append(time.monotonic())
            i += 1

    clients = [asyncio.ensure_future(client(c)) for c in range(a.concurrency)]
    t0 = time.monotonic()
    await asyncio.sleep(a.phase_s)
    asked = time.monotonic()
    op, _ = await scaler.scale_out({"num_engines": a.add})
    await until_done(op)
    joined = time.monotonic()
    await asyncio.sleep(a.phase_s)
    end = time.monotonic()
    stop.set()
    await asyncio.gather(*clients, return_exceptions=True)
    await fleet.stop()

    def rate(lo: float, hi: float) -> float:
        return sum(lo <= t < hi for t in done) / (hi - lo)

    return {"engines_before": 1, "engines_after": 1 + len(op.added), "operation": op.status,
            "scale_out_seconds": round(joined - asked, 2), "samples_per_s_before": round(rate(t0 + 2, asked), 2),
            "samples_per_s_during_scale_out": round(rate(asked, joined), 2),
            "samples_per_s_after": round(rate(joined, end), 2), "concurrency": a.concurrency,
            "max_new_tokens": a.max_new_tokens}


def cost(step: int, a: argparse.Namespace) -> int:
    """Cheap, expensive for the middle third of the run, cheap again."""
    third = a.steps // 3
    return a.expensive_tokens if third <= step < 2 * third else a.cheap_tokens


async def autoscaled(model_dir: str, log_dir: str, a: argparse.Namespace) -> list[dict]:
    from relax.config.autoscaler import AutoscalerConfig
    from relax.engine.elastic.autoscaler import Autoscaler, Signals
    from relax.utils.http_utils import post

    fleet, scaler = await new_fleet(model_dir, log_dir)
    last: dict[str, float] = {}

    async def signals() -> Signals:
        active = [e for e in fleet.table() if e["state"] == "active"]
        return Signals(engines=len(active), removable=sum(not e["protected"] for e in active),
                       busy=scaler.book.running is not None, trainer_wait=last.get("trainer_wait"))

    cfg = AutoscalerConfig(min_engines=1, max_engines=a.max_engines, target_metric="trainer_wait",
                           scale_out_threshold=a.out_threshold, scale_in_threshold=a.in_threshold,
                           cooldown_s=a.cooldown_s, step_size=1)
    auto = Autoscaler(cfg, scaler, signals)
    rows = []
    for step in range(a.steps):
        t0 = time.monotonic()
        tokens = cost(step, a)
        await asyncio.gather(*(post(fleet.router_url + "/generate", request(tokens, step * 100 + i))
                               for i in range(a.batch)))
        rollout = time.monotonic() - t0
        await asyncio.sleep(a.train_s)  # the trainer's part of the step
        last["trainer_wait"] = rollout / (time.monotonic() - t0)
        decision = await auto.step()
        rows.append({"step": step, "engines": len(fleet.urls), "tokens": tokens, "rollout_s": round(rollout, 2),
                     "trainer_wait": round(last["trainer_wait"], 3), "samples_per_s": round(a.batch / rollout, 1),
                     "decision": f"{decision.action} {decision.count}" if decision.count else decision.action,
                     "reason": decision.reason})
        print(f"  step {step:>2}: {rows[-1]['engines']} engine(s)  {tokens:>3} tok  rollout {rollout:5.2f}s  "
              f"wait {last['trainer_wait']:.2f}  -> {rows[-1]['decision']}", flush=True)
    while scaler.book.running is not None:
        await asyncio.sleep(0.1)
    await fleet.stop()
    return rows


async def main_async(a: argparse.Namespace) -> dict:
    from relax.backends.hf.tiny_model import build_tiny_qwen3
    from relax.utils.http_utils import close_sessions

    work = tempfile.mkdtemp(prefix="elastic-bench-")
    model_dir = str(build_tiny_qwen3(os.path.join(work, "model"), seed=0, hidden_size=a.hidden_size,
                                     num_hidden_layers=a.num_layers))  # big enough that decoding, not HTTP, costs
    print("1. throughput before/after engines join mid-run", flush=True)
    part1 = await throughput(model_dir, work, a)
    print("2. autoscaler over a run whose rollout cost changes", flush=True)
    part2 = await autoscaled(model_dir, work, a)
    await close_sessions()
    return {"machine": {"cpus": os.cpu_count(), "load_avg_at_end": os.getloadavg()}, "throughput": part1,
            "autoscaler": part2, "args": vars(a)}


def table(result: dict) -> str:
    t = result["throughput"]
    lines = ["| engines | samples/s |", "|---|---|",
             f"| {t['engines_before']} (before) | {t['samples_per_s_before']} |",
             f"| {t['engines_before']} -> {t['engines_after']} (scale-out, {t['scale_out_seconds']} s) | "
             f"{t['samples_per_s_during_scale_out']} |",
             f"| {t['engines_after']} (after) | {t['samples_per_s_after']} |", "",
             "| step | tokens | engines | rollout s | trainer wait | decision |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['step']} | {r['tokens']} | {r['engines']} | {r['rollout_s']} | {r['trainer_wait']} | "
              f"{r['decision']} |" for r in result["autoscaler"]]
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hidden-size", type=int, default=512)
    p.add_argument("--num-layers", type=int, default=4)
    p.add_argument("--phase-s", type=float, default=20.0)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--add", type=int, default=1)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--train-s", type=float, default=1.0)
    p.add_argument("--cheap-tokens", type=int, default=4)
    p.add_argument("--expensive-tokens", type=int, default=64)
    p.add_argument("--max-engines", type=int, default=3)
    p.add_argument("--out-threshold", type=float, default=0.3)
    p.add_argument("--in-threshold", type=float, default=0.15)
    p.add_argument("--cooldown-s", type=float, default=3.0)
    p.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "elastic_scaling.json"))
    a = p.parse_args()
    result = asyncio.run(main_async(a))
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(result, f, indent=2)
    print(table(result))
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
