"""scripts/entrypoint/ray_node.sh: a `ray start` that misses Ray's registration deadline is stopped
and started again with the same flags; any other failure ends the wait with the node's output."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "entrypoint" / "ray_node.sh"

# A stand-in for Ray's CLI (no Ray node starts in a unit test): each call is counted in $CALLS;
# while the count is below $FAIL_TIMES it prints $FAIL_LINE and exits 1, then it says it started.
FAKE_RAY = """#!/bin/bash
echo "$*" >> "${CALLS}"
n=$(wc -l < "${CALLS}")
if [ "${n}" -le "${FAIL_TIMES}" ]; then echo "${FAIL_LINE}"; exit 1; fi
echo "Ray runtime started."
exec sleep 30
"""


def _start(tmp_path: Path, fail_times: int, fail_line: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ray").write_text(FAKE_RAY)
    (bin_dir / "ray").chmod(stat.S_IRWXU)
    calls = tmp_path / "calls"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "CALLS": str(calls),
           "FAIL_TIMES": str(fail_times), "FAIL_LINE": fail_line}
    script = (f'source "{SCRIPT}"; relax_start_node "{tmp_path}/node.log" --head --port 6390; '
              f'relax_wait_started "{tmp_path}/node.log" 20; rc=$?; relax_stop_node; exit $rc')
    done = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=60)
    return done, calls.read_text().splitlines()


def test_a_node_that_missed_the_registration_deadline_starts_again_with_its_flags(tmp_path):
    done, calls = _start(tmp_path, 2, "Exception: The current node timed out during startup.")
    assert done.returncode == 0, done.stderr
    assert len(calls) == 3 and all("--head --port 6390" in c for c in calls)
    assert done.stderr.count("did not register in time") == 2
    assert (tmp_path / "node.log.attempt1").read_text().strip().endswith("timed out during startup.")


@pytest.mark.parametrize("fail_times, line", [(1, "ValueError: port 6390 is taken"),
                                              (3, "Exception: The current node timed out during startup.")])
def test_another_failure_or_the_last_timeout_ends_the_wait_with_the_nodes_output(tmp_path, fail_times, line):
    done, calls = _start(tmp_path, fail_times, line)
    assert done.returncode == 1
    assert len(calls) == min(fail_times, 3)
    assert "ray start did not come up" in done.stderr and line in done.stderr
