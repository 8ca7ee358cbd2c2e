"""bench/run_cost.py's pure parts: the line through (steps, CPU-seconds) and the kind of a process."""

from __future__ import annotations

import pytest

from bench.run_cost import line_fit, process_kind


def test_the_line_gives_the_fixed_cost_and_the_cost_of_a_step():
    fixed, per_step = line_fit([(1, 50.0), (4, 59.0), (1, 52.0), (4, 61.0)])
    assert per_step == pytest.approx(3.0) and fixed == pytest.approx(48.0)
    with pytest.raises(ValueError, match="two different step counts"):
        line_fit([(1, 50.0), (1, 52.0)])


@pytest.mark.parametrize("cmdline, kind", [
    ("ray::ServeReplica:relax-27ad8164-rollout:rollout", "replica:rollout"),
    ("ray::ServeReplica:relax-27ad8164-actor:actor.train()", "replica:actor"),
    ("/usr/bin/python3 -m relax.backends.hf.server --model-path /m --port 1", "hf engine"),
    ("ray::Trainer.compute_log_probs", "training rank"),
    ("ray::RewardActor", "reward worker"),
    ("ray::TransferQueueController.get", "TransferQueueController"),
    ("ray::IDLE", "ray worker (IDLE)"),
    ("/site-packages/ray/core/src/ray/gcs/gcs_server --log_dir=/tmp", "ray daemons"),
    ("python3 /site-packages/ray/_private/workers/default_worker.py --node-ip-address=127.0.0.1", "ray worker (idle)"),
    ("/usr/bin/python3 -B -c from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=35)",
     "spawned process (multiprocessing)"),
    ("/usr/bin/python3 -u -c import sys;exec(eval(sys.stdin.readline()))", "pytest-xdist worker"),
    ("python3 -m examples.tiny_math.prepare --out-dir /x", "python -m examples.tiny_math.prepare"),
    ("python3 relax/entrypoints/train.py --colocate", "python train.py"),
    ("bash -c exec python3 x.py", "other: bash"),
    ("", "other: ?"),
])
def test_a_process_is_named_by_the_role_or_daemon_it_runs(cmdline, kind):
    assert process_kind(cmdline) == kind
