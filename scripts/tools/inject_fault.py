"""Send a signal to one rollout engine of a running `relax-train` run, at a given step: try out
`--use-fault-tolerance` (tier 1) or `--use-health-check` (tier 2) on a run of your own.

    python3 scripts/tools/inject_fault.py RUN_DIR --at-step 10 [--engine 0] [--signal KILL|STOP]

RUN_DIR is the run's `--exp-dir`. The tool waits until the run has logged the step before step
`--at-step` (console numbering: `step 10/80` is step 10) to `RUN_DIR/metrics.jsonl`, then until the
engine has requests running (mid-rollout), and sends the signal to that engine alone: the `hf`
engine process whose output goes to `RUN_DIR/engine_<i>.log`. It never signals anything else.
Start it before (or while) the run starts: rows already in metrics.jsonl (an earlier run in the same
directory) do not count.
`scripts/training/text/run-tiny-cpu.sh` runs it when `KILL_ENGINE_AT_STEP` is set.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
import urllib.request
from pathlib import Path


def engine_process(run_dir: Path, index: int) -> tuple[int, str] | None:
    """(pid, url) of the live hf engine logging to RUN_DIR/engine_<index>.log."""
    log = str(run_dir / f"engine_{index}.log")
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
            if "relax.backends.hf.server" in cmd and os.readlink(proc / "fd" / "1") == log:
                return int(proc.name), f"http://127.0.0.1:{cmd[cmd.index('--port') + 1]}"
        except (OSError, ValueError, IndexError):
            continue
    return None


def logged_steps(run_dir: Path, offset: int) -> set[int]:
    """Steps logged to RUN_DIR/metrics.jsonl after its first `offset` bytes (rows of earlier runs)."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return set()
    with open(path, "rb") as f:
        f.seek(offset)
        lines = f.read().decode(errors="replace").splitlines()
    return {json.loads(line)["step"] for line in lines if '"time/step"' in line}


def load(url: str) -> int:
    """Requests running or queued on the engine (0 when it does not answer)."""
    try:
        with urllib.request.urlopen(url + "/get_server_info", timeout=2) as reply:
            return int(json.load(reply)["internal_states"][0]["load"])
    except (OSError, ValueError, KeyError, IndexError):
        return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path, help="the run's --exp-dir")
    parser.add_argument("--at-step", type=int, required=True, help="console step number (1 = the first step)")
    parser.add_argument("--engine", type=int, default=0, help="which engine: engine_<i>.log (default 0)")
    parser.add_argument("--signal", choices=["KILL", "STOP"], default="KILL",
                        help="KILL: the engine dies; STOP: it hangs, alive but silent (default KILL)")
    parser.add_argument("--timeout", type=float, default=3600.0, help="give up after this many seconds")
    args = parser.parse_args(argv)
    if args.at_step < 1:
        parser.error(f"--at-step counts from 1 (the console's `step 1/N`), got {args.at_step}")
    deadline, run_dir = time.monotonic() + args.timeout, args.run_dir.resolve()
    metrics = run_dir / "metrics.jsonl"
    offset = metrics.stat().st_size if metrics.exists() else 0  # a reused run directory: only new rows count
    while args.at_step - 2 >= 0 and args.at_step - 2 not in logged_steps(run_dir, offset):  # the step before
        if time.monotonic() > deadline:
            print(f"inject_fault: step {args.at_step - 1} was not logged to {run_dir}/metrics.jsonl in "
                  f"{args.timeout:.0f}s; nothing signalled", file=sys.stderr)
            return 1
        time.sleep(0.2)
    found = None
    while time.monotonic() < deadline:
        found = engine_process(run_dir, args.engine)
        if found and load(found[1]) > 0:  # mid-rollout: requests in flight
            break
        time.sleep(0.05)
    if found is None:
        print(f"inject_fault: no live engine logging to {run_dir}/engine_{args.engine}.log; nothing signalled",
              file=sys.stderr)
        return 1
    pid, url = found
    in_flight = load(url)
    os.kill(pid, getattr(signal, f"SIG{args.signal}"))
    print(f"inject_fault: SIG{args.signal} to engine {args.engine} (pid {pid}, {url}) during step {args.at_step}, "
          f"{in_flight} request(s) in flight", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
