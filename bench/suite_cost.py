"""Where the README's test command spends the machine's CPU: each pytest-xdist group alone, and its tests.

The suite runs on two xdist workers (tests/conftest.py): the `integration` group (the session's Ray
cluster and its runs), `own_ray` (runs that start a Ray of their own), `multinode`, `rank_pool`, and
every other module as a group of its own (`units` here). On a 2-core machine the suite is CPU-bound, so
its wall time is about the machine's CPU-seconds over 2, whatever the split: the CPU-seconds each group
and each test spend, Ray's processes and spawned ranks included, are what to cut. This bench runs the
groups one after another, each alone in one pytest process (`-n 0`), and reads the machine's
CPU-seconds (/proc/stat: every process) around each test; run alone, a group's wall time is also shorter
than in the suite, where it shares the cores.

    python3 bench/suite_cost.py [--groups integration own_ray multinode rank_pool units] [--top 8]
                                [--out bench/results/suite_cost_cpu.json]

Prints a table per group (wall, CPU-seconds, its costliest tests, and the kinds of process its CPU went to:
the processes the run started, sampled from /proc every 0.5 s and named by bench/run_cost.py's
`process_kind`, and the pytest process itself) and the total; measure on a quiet machine, the figures
are the whole machine's. The same file is the pytest plugin each run loads
(`-p bench.suite_cost`, with SUITE_COST_GROUP and SUITE_COST_OUT set)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # run as `python3 bench/<name>.py`: the repo root (bench/, relax/) imports
from bench.run_cost import ProcessSampler, machine_cpu_s  # noqa: E402  (/proc/stat; /proc/<pid> by kind)

GROUP_ENV, OUT_ENV = "SUITE_COST_GROUP", "SUITE_COST_OUT"
# The groups tests/conftest.py names; every other test module is a group of its own ("units" here).
NAMED_GROUPS = ("integration", "own_ray", "multinode", "rank_pool")
GROUPS = (*NAMED_GROUPS, "units")


def suite_group(marker_group: str | None) -> str:
    """The bench's group of a test whose xdist group (tests/conftest.py) is `marker_group`."""
    return marker_group if marker_group in NAMED_GROUPS else "units"


def summarize(group: str, rows: list[dict], wall_s: float, cpu_s: float, top: int,
              by_kind: dict[str, dict[str, float]] | None = None) -> dict:
    """One group's figures: its run's wall time and CPU-seconds, its `top` costliest tests, and the `top`
    costliest kinds of process it ran (the rest of the machine's CPU-seconds went to processes started
    before it and to other users of the machine)."""
    rows = sorted(rows, key=lambda r: -r["cpu_s"])
    kinds = sorted((by_kind or {}).items(), key=lambda kv: -kv[1]["cpu_s"])
    return {"group": group, "tests": len(rows), "wall_s": round(wall_s, 1), "cpu_s": round(cpu_s, 1),
            "cores_busy": round(cpu_s / wall_s, 2) if wall_s else None, "top": rows[:top],
            "by_kind": [{"kind": k, "cpu_s": round(v["cpu_s"], 1), "processes": int(v["processes"])}
                        for k, v in kinds[:top]]}


# ---- the pytest plugin (`-p bench.suite_cost`) ---------------------------------------------------

_rows: list[dict] = []
_sampler: ProcessSampler | None = None
# The processes a group's run starts (Ray's, replicas, ranks, engines, spawned ones), sampled this often.
SAMPLE_S = 0.5


def pytest_sessionstart(session) -> None:
    global _sampler
    if os.environ.get(OUT_ENV):
        _sampler = ProcessSampler(SAMPLE_S).start()


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items) -> None:
    """Keep only the tests of SUITE_COST_GROUP (run after tests/conftest.py has grouped them)."""
    want = os.environ.get(GROUP_ENV)
    if not want:
        return
    keep, drop = [], []
    for item in items:
        marker = item.get_closest_marker("xdist_group")
        name = (marker.kwargs.get("name") or marker.args[0]) if marker else None
        (keep if suite_group(name) == want else drop).append(item)
    items[:] = keep
    config.hook.pytest_deselected(items=drop)



@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """A test's setup, call and teardown, with the machine's CPU-seconds around them."""
    cpu, wall = machine_cpu_s(), time.monotonic()
    yield
    _rows.append({"test": item.nodeid, "wall_s": round(time.monotonic() - wall, 1),
                  "cpu_s": round(machine_cpu_s() - cpu, 1)})



def pytest_sessionfinish(session) -> None:
    """Writes {"rows": a row per test, "by_kind": CPU-seconds and count of the processes the run started,
    by kind (bench/run_cost.py's `process_kind`), and this pytest process's own (the in-process tests and
    the sampler)}."""
    out = os.environ.get(OUT_ENV)
    if not out:
        return
    by_kind: dict[str, dict[str, float]] = {}
    if _sampler is not None:
        _sampler.stop()
        by_kind = _sampler.by_kind()
    by_kind["pytest (in-process tests)"] = {"cpu_s": time.process_time(), "processes": 1}
    with open(out, "w") as f:
        json.dump({"rows": _rows, "by_kind": by_kind}, f)


# ---- the bench ----------------------------------------------------------------------------------

def run_group(group: str) -> tuple[dict, float, float, int]:
    """pytest on `group` alone; (the plugin's rows and processes by kind, wall s, machine CPU-s, pytest's
    exit code)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rows.json")
        env = os.environ | {GROUP_ENV: group, OUT_ENV: out}
        cmd = [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", "-p", "bench.suite_cost",
               "tests"]
        cpu, wall = machine_cpu_s(), time.monotonic()
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
        wall, cpu = time.monotonic() - wall, machine_cpu_s() - cpu
        if proc.returncode != 0:  # (what failed, before the figures that include it)
            print(proc.stdout[-3000:] + proc.stderr[-2000:], file=sys.stderr)
        found = json.load(open(out)) if os.path.exists(out) else {"rows": [], "by_kind": {}}
    return found, wall, cpu, proc.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--groups", nargs="+", choices=GROUPS, default=list(GROUPS))
    parser.add_argument("--top", type=int, default=8, help="costliest tests listed per group")
    parser.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "suite_cost_cpu.json"))
    args = parser.parse_args()
    groups = []
    for group in args.groups:
        found, wall, cpu, code = run_group(group)
        summary = summarize(group, found["rows"], wall, cpu, args.top, found["by_kind"]) | {"pytest_exit_code": code}
        groups.append(summary)
        print(f"{group:<12} {summary['tests']:5d} tests  {wall:7.1f} s  {cpu:7.1f} CPU-s  "
              f"({summary['cores_busy']} cores busy){'' if code == 0 else f'  pytest exit code {code}'}", flush=True)
        for row in summary["top"]:
            print(f"    {row['cpu_s']:7.1f} CPU-s {row['wall_s']:7.1f} s  {row['test']}", flush=True)
        for row in summary["by_kind"]:
            print(f"    {row['cpu_s']:7.1f} CPU-s {row['processes']:5d} x  {row['kind']}", flush=True)
    total = sum(g["cpu_s"] for g in groups)
    print(f"total: {total:.1f} CPU-s; on {os.cpu_count()} cores at best {total / (os.cpu_count() or 1):.0f} s of "
          "wall time for these groups")
    with open(args.out, "w") as f:
        json.dump({"machine": f"{os.cpu_count()} CPUs (CPU only)", "groups": groups, "total_cpu_s": round(total, 1)},
                  f, indent=1)


if __name__ == "__main__":
    main()
