"""What one run costs on a CPU machine: its fixed start-up and tear-down against its steps, and which
processes spend it.

The integration tests run some thirty tiny jobs through the real service graph, most on one Ray
cluster that lives for the test session (tests/integration/conftest.py). This bench starts Ray,
TransferQueue and Serve the same way, builds the same tiny model and task, then runs the tests'
shared colocate GRPO job (a Reference beside the Actor, one engine, one reward worker) once per
`--steps` value, one after another on the same cluster, and measures each run's wall time and the
machine's CPU-seconds (/proc/stat: every process, Ray's included). Two step counts give a straight
line: CPU-seconds = fixed + per_step x steps. While the last run goes, /proc is sampled every 0.2 s
and the CPU of every process the run started is summed by kind (a role's Serve replica, a training
rank, an engine, a reward worker, Ray's own), which shows where the fixed cost goes.

    python3 bench/run_cost.py [--steps 1 4] [--repeats 1] [--out bench/results/run_cost_cpu.json]

Prints a table and ends with `fixed_cpu_s=<a> per_step_cpu_s=<b>`. Measure on a quiet machine:
the figures are the whole machine's.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # run as `python3 bench/<name>.py`: the repo root (examples/, relax/) imports
TICK = os.sysconf("SC_CLK_TCK")

# (pattern in a process's command line, kind), first match wins
KINDS = (
    (r"ServeReplica:[^:\s]*:(\w+)", "replica:{0}"),
    (r"relax\.backends\.hf\.server", "hf engine"),
    (r"ray::Trainer", "training rank"),
    (r"ray::RewardActor", "reward worker"),
    (r"ray::(ServeController|TransferQueueController|SimpleStorageUnit|DashboardAgent|RuntimeEnvAgent)", "{0}"),
    (r"ray::(\w+)", "ray worker ({0})"),
    (r"gcs_server|/raylet|dashboard|log_monitor|autoscaler", "ray daemons"),
    (r"default_worker\.py", "ray worker (idle)"),
    (r"multiprocessing\.spawn", "spawned process (multiprocessing)"),
    (r"multiprocessing\.forkserver", "multiprocessing forkserver"),
    (r"exec\(eval\(sys\.stdin", "pytest-xdist worker"),
    (r"^\S*python[\d.]*\s+(?:-\S+\s+)*-m\s+([\w.]+)", "python -m {0}"),
    (r"^\S*python[\d.]*\s+(?:-\S+\s+)*\S*?([\w.-]+\.py)\b", "python {0}"),
)


def process_kind(cmdline: str) -> str:
    """A process's kind for the per-kind table, from its command line (Ray rewrites it to the
    actor's or replica's name)."""
    for pattern, kind in KINDS:
        match = re.search(pattern, cmdline)
        if match:
            return kind.format(*match.groups())
    return "other: " + (cmdline.split()[0].rsplit("/", 1)[-1] if cmdline.strip() else "?")


def machine_cpu_s() -> float:
    """CPU-seconds the whole machine has spent since boot (user, nice, system, irq, softirq)."""
    with open("/proc/stat") as f:
        user, nice, system, _idle, _iowait, irq, softirq = map(int, f.readline().split()[1:8])
    return (user + nice + system + irq + softirq) / TICK


def line_fit(points: list[tuple[float, float]]) -> tuple[float, float]:
    """(intercept, slope) of the least-squares line through (x, y) points (two x values or more)."""
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        raise ValueError("a line needs runs of at least two different step counts (--steps 1 4)")
    slope = sum((x - mx) * (y - my) for x, y in points) / sxx
    return my - slope * mx, slope


class ProcessSampler:
    """Samples /proc every `interval` s from a thread; `by_kind()`: CPU-seconds and process count per
    kind of every process that started after `start()` (its last sample: one that lives shorter than
    an interval is missed, and one sample's worth of CPU may be)."""

    def __init__(self, interval: float = 0.2) -> None:
        self.interval, self.seen = interval, {}
        self._stop = threading.Event()
        self._before = self._pids()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def _pids() -> set[str]:
        return {p for p in os.listdir("/proc") if p.isdigit()}

    def _sample(self) -> None:
        for pid in self._pids() - self._before:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            key = (pid, fields[19])  # (pid, start time): a reused pid is another process
            cpu = (int(fields[11]) + int(fields[12])) / TICK
            old = self.seen.get(key)
            # a replica is named once its constructor runs: keep the latest name a process had
            self.seen[key] = (max(cpu, old[0] if old else 0.0), cmd if cmd.strip() else (old[1] if old else ""))

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            time.sleep(self.interval)

    def start(self) -> "ProcessSampler":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def by_kind(self) -> dict[str, dict[str, float]]:
        kinds: dict[str, dict[str, float]] = {}
        for cpu, cmd in self.seen.values():
            row = kinds.setdefault(process_kind(cmd), {"cpu_s": 0.0, "processes": 0})
            row["cpu_s"] += cpu
            row["processes"] += 1
        return dict(sorted(kinds.items(), key=lambda kv: -kv[1]["cpu_s"]))


def start_session() -> None:
    """Ray, TransferQueue and Serve as the integration tests' session starts them, in the environment
    the tests give a run's processes (tests/conftest.py)."""
    from tests.integration.run_helpers import start_session_cluster

    from relax.utils.proc import cpu_compute_env

    os.environ.setdefault("RELAX_STARTUP_GC", "1")  # what configs/env.yaml gives a run's processes
    os.environ.update(cpu_compute_env())
    start_session_cluster(ROOT)


def tiny_task(root: Path) -> None:
    """The tests' tiny Qwen3, its own tokenizer, 64 prompts of the quickstart task."""
    import random

    from examples.tiny_math.task import make_row, sample_numbers, tokenizer_corpus
    from relax.utils.tiny_model import build_tiny_qwen3, save_tiny_model, train_chatml_tokenizer

    tokenizer = train_chatml_tokenizer(tokenizer_corpus(), vocab_size=300)
    save_tiny_model(build_tiny_qwen3(tokenizer), tokenizer, str(root / "model"))
    rng = random.Random(0)
    with open(root / "train.jsonl", "w") as f:
        for _ in range(64):
            f.write(json.dumps(make_row(sample_numbers(rng))) + "\n")


def one_run(root: Path, exp_dir: Path, steps: int) -> dict[str, float]:
    """The integration tests' shared colocate GRPO job (`reference_args`: a Reference, their sync reward
    plugin in one worker process) for `steps` steps; its wall time and the machine's CPU-seconds."""
    from tests.integration.run_helpers import reference_args, run_relax

    cpu0, wall0, own0 = machine_cpu_s(), time.monotonic(), time.process_time()
    run_relax(reference_args(root, exp_dir, num_rollout=steps))
    return {"steps": steps, "wall_s": time.monotonic() - wall0, "cpu_s": machine_cpu_s() - cpu0,
            "driver_cpu_s": time.process_time() - own0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", nargs="+", type=int, default=[1, 4], help="steps of each run (two values or more)")
    parser.add_argument("--repeats", type=int, default=1, help="runs per step count")
    parser.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "run_cost_cpu.json"))
    args = parser.parse_args()
    if len(set(args.steps)) < 2:
        parser.error("--steps needs two different step counts or more (the line's intercept is the fixed cost)")
    start_session()
    runs, sampler = [], None
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        tiny_task(root)
        idle0 = machine_cpu_s()
        time.sleep(20)
        idle_per_min = (machine_cpu_s() - idle0) * 3
        plan = [s for _ in range(args.repeats) for s in args.steps]
        for i, steps in enumerate(plan):
            if i == len(plan) - 1:
                sampler = ProcessSampler().start()
            runs.append(one_run(root, root / f"run{i}", steps))
            print(f"run {i}: {steps} steps  {runs[-1]['wall_s']:6.1f} s  {runs[-1]['cpu_s']:6.1f} CPU-s "
                  f"(driver {runs[-1]['driver_cpu_s']:.1f})", flush=True)
        sampler.stop()
    fixed, per_step = line_fit([(r["steps"], r["cpu_s"]) for r in runs])
    kinds = sampler.by_kind()
    print(f"\nidle cluster: {idle_per_min:.1f} CPU-s a minute")
    print(f"the last run ({plan[-1]} steps) by process kind:")
    for kind, row in kinds.items():
        print(f"  {row['cpu_s']:7.1f} CPU-s  {int(row['processes']):3d} process(es)  {kind}")
    result = {"machine": f"{os.cpu_count()} CPUs (CPU only)", "runs": runs, "fixed_cpu_s": fixed,
              "per_step_cpu_s": per_step, "idle_cpu_s_per_min": idle_per_min, "last_run_by_kind": kinds}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(f"fixed_cpu_s={fixed:.1f} per_step_cpu_s={per_step:.1f}")


if __name__ == "__main__":
    main()
