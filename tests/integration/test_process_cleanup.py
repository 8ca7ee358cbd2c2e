"""A run leaves no process behind: not after a normal exit, not after Ctrl-C.

Each run is a real `relax-train` subprocess with its own private Ray instance. Every process
it starts (raylet, workers, Serve replicas, train workers, engines) inherits a marker env
var; after the run we look for any live process that still carries it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration


def marked_processes(marker: str) -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            environ = (proc / "environ").read_bytes()
        except OSError:
            continue
        if f"RELAX_TEST_MARKER={marker}".encode() in environ:
            pids.append(int(proc.name))
    return pids


def wait_until_gone(marker: str, timeout: float = 60.0) -> list[int]:
    deadline = time.time() + timeout
    while time.time() < deadline:
        left = marked_processes(marker)
        if not left:
            return []
        time.sleep(1.0)
    return [(pid, Path(f"/proc/{pid}/cmdline").read_bytes()[:120]) for pid in marked_processes(marker)]


def start_run(tiny_setup, tmp_path, num_rollout: int, marker: str, mode: tuple[str, ...] = ()) -> subprocess.Popen:
    root = tiny_setup
    env = dict(os.environ, RELAX_TEST_MARKER=marker, PYTHONUNBUFFERED="1")
    env.pop("RAY_ADDRESS", None)
    cmd = [sys.executable, "relax/entrypoints/train.py", "--hf-checkpoint", str(root / "model"),
           "--prompt-data", str(root / "train.jsonl"), "--input-key", "prompt", "--label-key", "label",
           "--apply-chat-template", "--rm-type", "math", "--rollout-batch-size", "4", "--n-samples-per-prompt", "2",
           "--rollout-max-response-len", "8", "--num-rollout", str(num_rollout), "--progress-bar", "false",
           "--ray-num-cpus", "8", "--exp-dir", str(tmp_path), *mode]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=Path(__file__).resolve().parents[2])


def test_normal_exit_leaves_no_process(tiny_setup, tmp_path):
    marker = uuid.uuid4().hex
    proc = start_run(tiny_setup, tmp_path, 1, marker)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out[-3000:]
    assert "step 1/1" in out
    assert wait_until_gone(marker) == []


FULLY_ASYNC = ("--fully-async", "--max-staleness", "1", "--resource",
               '{"actor": [1, 1], "rollout": [1, 1], "actor_fwd": [1, 1], "advantages": [1, 0]}')


@pytest.mark.parametrize("mode", [(), FULLY_ASYNC], ids=["colocate", "fully_async"])
def test_ctrl_c_leaves_no_process(tiny_setup, tmp_path, mode):
    """Fully async adds role loops in flight (rollout ahead, ActorFwd mid-forward) at the signal."""
    marker = uuid.uuid4().hex
    proc = start_run(tiny_setup, tmp_path, 1000, marker, mode)
    lines = []
    deadline = time.time() + 300
    for line in proc.stdout:  # wait until training is really under way
        lines.append(line)
        if line.startswith("step 1/1000") or time.time() > deadline:
            break
    assert any(line.startswith("step 1/1000") for line in lines), "".join(lines[-50:])
    assert len(marked_processes(marker)) > 3  # driver, raylet, workers, engine...
    proc.send_signal(signal.SIGINT)
    rest, _ = proc.communicate(timeout=120)
    assert proc.returncode != 0
    assert wait_until_gone(marker) == []
