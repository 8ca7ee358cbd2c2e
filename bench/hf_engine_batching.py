"""How well the `hf` engine batches a burst of concurrent /generate requests.

Launches one `hf` engine on a random tiny Qwen3 (`relax.backends.hf.tiny_model`), then fires N
concurrent /generate requests through httpx, several rounds, in two arrival patterns:
  burst    all N requests at once (as fast as one asyncio client sends them);
  trickle  arrivals spread uniformly over `--spread-ms` (what a router in front of the engine
           delivers during an RL rollout).
For each round it reads /get_server_info before and after and reports the wall time, the
engine's `busy_seconds` (wall time inside batched prefill/decode), how many batches were started
from idle, how many groups joined a running batch, and the running batch sizes recorded.

The client is httpx (one AsyncClient, as `relax.utils.http_utils` uses); `--client aiohttp`
sends the same requests with aiohttp, whose client is much cheaper per request on a small CPU,
so the burst reaches the engine as a burst and the engine side is what is measured.

`--in-process` skips HTTP: it drives the engine's `Scheduler` + `BatchDecoder` directly (on
`--device`, e.g. cuda) with the same arrival patterns, once with joining (continuous
batching) and once with `BatchDecoder.can_join = False` (the old behaviour: requests that
arrive while a batch decodes wait for the next batch), so both are measured in one process.

    python3 bench/hf_engine_batching.py [--n 128] [--max-new-tokens 16] [--rounds 3] [--spread-ms 50]
        [--client httpx|aiohttp] [--hidden-size 32] [--num-layers 2] [--in-process --device cuda]
        [--out bench/results/hf_engine_batching.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # run as `python3 bench/<name>.py`: the repo root (examples/, relax/) imports


class HttpxClient:
    def __init__(self, url: str, connections: int):
        import httpx

        limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
        self._client = httpx.AsyncClient(base_url=url, limits=limits, timeout=300)

    async def get(self, path: str) -> dict:
        reply = await self._client.get(path)
        reply.raise_for_status()
        return reply.json()

    async def post(self, path: str, body: dict) -> dict:
        reply = await self._client.post(path, json=body)
        reply.raise_for_status()
        return reply.json()

    async def close(self) -> None:
        await self._client.aclose()


class AiohttpClient:
    def __init__(self, url: str, connections: int):
        import aiohttp

        self._url = url
        self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=connections),
                                              timeout=aiohttp.ClientTimeout(total=300))

    async def get(self, path: str) -> dict:
        async with self._session.get(self._url + path) as reply:
            reply.raise_for_status()
            return await reply.json()

    async def post(self, path: str, body: dict) -> dict:
        async with self._session.post(self._url + path, json=body) as reply:
            reply.raise_for_status()
            return await reply.json()

    async def close(self) -> None:
        await self._session.close()


CLIENTS = {"httpx": HttpxClient, "aiohttp": AiohttpClient}


async def one_round(client, n: int, max_new_tokens: int, spread_s: float, rng: random.Random) -> dict:
    """Send n requests (arrivals spread over spread_s) and measure the engine's counters around them."""
    before = await client.get("/get_server_info")

    async def request(i: int) -> dict:
        if spread_s > 0:
            await asyncio.sleep(rng.uniform(0, spread_s))
        prompt = [rng.randrange(4, 64) for _ in range(rng.randrange(4, 16))]
        return await client.post("/generate", {"input_ids": prompt, "rid": f"bench-{i}", "sampling_params": {
            "temperature": 1.0, "max_new_tokens": max_new_tokens, "ignore_eos": True}})

    start = time.perf_counter()
    replies = await asyncio.gather(*(request(i) for i in range(n)))
    wall = time.perf_counter() - start
    after = await client.get("/get_server_info")
    batches = after["num_batches"] - before["num_batches"]
    joins = after.get("num_joins", 0) - before.get("num_joins", 0)
    recorded = batches + joins  # one recent_batch_sizes entry per batch start and per join
    return {
        "wall_s": wall, "busy_s": after["busy_seconds"] - before["busy_seconds"], "batches": batches,
        "joins": joins, "forward_calls": after["num_forward_calls"] - before["num_forward_calls"],
        "tokens": sum(r["meta_info"]["completion_tokens"] for r in replies),
        "batch_sizes": after["recent_batch_sizes"][-recorded:] if recorded else [],
    }


async def run_bench(url: str, args) -> list[dict]:
    rng = random.Random(0)
    rows = []
    client = CLIENTS[args.client](url, args.n + 8)
    try:
        await client.post("/generate", {"input_ids": [5], "sampling_params": {"max_new_tokens": 2}})  # warm-up
        for mode, spread_ms in (("burst", 0.0), ("trickle", args.spread_ms)):
            for r in range(args.rounds):
                row = await one_round(client, args.n, args.max_new_tokens, spread_ms / 1000, rng)
                rows.append({"mode": mode, "round": r, "spread_ms": spread_ms, **row})
                print_row(rows[-1])
    finally:
        await client.close()
    return rows


async def in_process_round(scheduler, n: int, max_new_tokens: int, spread_s: float, rng: random.Random) -> dict:
    """Like one_round, but calls `Scheduler.generate` directly (no HTTP)."""
    from relax.backends.hf.rows import DecodeRow
    from relax.backends.hf.sampling import parse_sampling_params

    params = parse_sampling_params({"temperature": 1.0, "max_new_tokens": max_new_tokens, "ignore_eos": True})
    stats = scheduler.decoder.stats
    before = (stats.busy_seconds, stats.batches, stats.joins, stats.forward_calls)

    async def request(i: int, delay: float, prompt: list[int]):
        await asyncio.sleep(delay)
        return await scheduler.generate(f"bench-{i}", DecodeRow(prompt, params))

    arrivals = [(rng.uniform(0, spread_s) if spread_s > 0 else 0.0,
                 [rng.randrange(4, 64) for _ in range(rng.randrange(4, 16))]) for _ in range(n)]
    start = time.perf_counter()
    results = await asyncio.gather(*(request(i, d, p) for i, (d, p) in enumerate(arrivals)))
    wall = time.perf_counter() - start
    batches, joins = stats.batches - before[1], stats.joins - before[2]
    return {"wall_s": wall, "busy_s": stats.busy_seconds - before[0], "batches": batches, "joins": joins,
            "forward_calls": stats.forward_calls - before[3], "tokens": sum(len(r.output_ids) for r in results),
            "batch_sizes": stats.recent_batch_sizes[-(batches + joins):] if batches + joins else []}


def run_in_process(model_dir: str, args) -> list[dict]:
    """Both modes (join / no join) against one in-process decoder on args.device."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from relax.backends.hf.decoder import BatchDecoder
    from relax.backends.hf.scheduler import Scheduler

    torch.set_num_threads(args.num_threads)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, args.dtype)).to(args.device).eval()
    decoder = BatchDecoder(model, AutoTokenizer.from_pretrained(model_dir), device=args.device, eos_token_ids=[2],
                           max_context_len=512, seed=0)
    rows = []

    async def go():
        scheduler = Scheduler(decoder, max_running_requests=max(256, args.n))
        scheduler.start()
        rng = random.Random(0)
        await in_process_round(scheduler, 8, 4, 0.0, rng)  # warm-up
        for join in (False, True):
            decoder.can_join = join
            for mode, spread_ms in (("burst", 0.0), ("trickle", args.spread_ms)):
                for r in range(args.rounds):
                    row = await in_process_round(scheduler, args.n, args.max_new_tokens, spread_ms / 1000, rng)
                    rows.append({"mode": f"{mode}/{'join' if join else 'no-join'}", "round": r,
                                 "spread_ms": spread_ms, **row})
                    print_row(rows[-1])
        await scheduler.stop()

    asyncio.run(go())
    return rows


def print_row(row: dict) -> None:
    sizes = row["batch_sizes"]
    shown = sizes if len(sizes) <= 12 else sizes[:6] + ["..."] + sizes[-5:]
    print(f"{row['mode']:>15} {row['round']:>5} {row['wall_s']:>8.3f} {row['busy_s']:>8.3f} {row['batches']:>8d} "
          f"{row['joins']:>6d} {row['forward_calls']:>8d} {row['tokens']:>7d}  {shown}", flush=True)


def summarize(rows: list[dict]) -> dict:
    out = {}
    for mode in sorted({r["mode"] for r in rows}):
        mine = [r for r in rows if r["mode"] == mode]
        out[mode] = {key: statistics.median(r[key] for r in mine)
                     for key in ("wall_s", "busy_s", "batches", "joins", "forward_calls")}
    return out


def run_over_http(model_dir: str, tmp: str, args) -> list[dict]:
    from relax.backends.hf.launcher import launch_hf_engine

    engine = launch_hf_engine(model_dir, num_threads=args.num_threads,
                              log_path=os.path.join(tmp, "engine.log")).wait_ready(timeout=120)
    try:
        return asyncio.run(run_bench(engine.url, args))
    finally:
        engine.terminate()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=128, help="concurrent requests per round")
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3, help="rounds per arrival pattern")
    parser.add_argument("--spread-ms", type=float, default=50.0, help="arrival window of the trickle pattern")
    parser.add_argument("--client", choices=sorted(CLIENTS), default="httpx", help="HTTP client library")
    parser.add_argument("--hidden-size", type=int, default=32, help="of the random Qwen3 (32 = the test model)")
    parser.add_argument("--num-layers", type=int, default=2, help="of the random Qwen3")
    parser.add_argument("--in-process", action="store_true", help="no HTTP: drive Scheduler + BatchDecoder")
    parser.add_argument("--device", default="cpu", help="for --in-process (the HTTP engine runs on cpu)")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"), help="for --in-process")
    parser.add_argument("--num-threads", type=int, default=1, help="torch threads of the engine")
    parser.add_argument("--label", default="", help="free text stored in the JSON (e.g. the git revision)")
    parser.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "hf_engine_batching.json"))
    args = parser.parse_args()

    from relax.backends.hf.tiny_model import build_tiny_qwen3

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_tiny_qwen3(os.path.join(tmp, "model"), seed=0, hidden_size=args.hidden_size,
                                     num_hidden_layers=args.num_layers)
        print(f"{'mode':>15} {'round':>5} {'wall_s':>8} {'busy_s':>8} {'batches':>8} {'joins':>6} "
              f"{'forwards':>8} {'tokens':>7}  running batch sizes")
        if args.in_process:
            rows = run_in_process(str(model_dir), args)
        else:
            rows = run_over_http(str(model_dir), tmp, args)
    summary = summarize(rows)
    for mode, s in summary.items():
        print(f"median {mode}: wall {s['wall_s']:.3f}s busy {s['busy_s']:.3f}s batches {s['batches']} "
              f"joins {s['joins']} forwards {s['forward_calls']}")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"config": vars(args), "label": args.label, "rounds": rows, "median": summary}, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
