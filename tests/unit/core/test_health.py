"""Tier 2 (global restart) decisions and the health event log, without Ray: which failures restart
the run, from where, how often; and what an event leaves behind (log file, counters)."""

from __future__ import annotations

import json

import pytest

from relax.config import ConfigError, parse_config
from relax.core.health import HealthEvents, resume_config, run_with_restarts, summary
from relax.utils import checkpoints


@pytest.fixture
def base(base, tmp_path):
    """The suite's smallest run (tests/conftest.py), saving checkpoints."""
    return base + ["--save", str(tmp_path / "ckpt")]


def failing(times: int, error: Exception, seen: list):
    """An attempt that fails `times` times with `error`, then returns the config it was given."""
    def attempt(cfg):
        seen.append(cfg)
        if len(seen) <= times:
            raise error
        return cfg
    return attempt


def test_a_failed_attempt_restarts_from_the_last_complete_checkpoint(base, tmp_path):
    cfg = parse_config(base + ["--use-health-check", "--start-rollout-id", "0"])
    checkpoints.commit(str(tmp_path / "ckpt"), 4, {})
    events, seen = HealthEvents(str(tmp_path / "run")), []
    done = run_with_restarts(cfg, failing(2, RuntimeError("rank died"), seen), events)
    assert len(seen) == 3 and seen[0] is cfg
    assert done.ckpt.load == str(tmp_path / "ckpt") and done.ckpt.load_fallback and done.data.start_rollout_id is None
    logged = [json.loads(line) for line in (tmp_path / "run" / "health_events.jsonl").read_text().splitlines()]
    assert [e["kind"] for e in logged] == ["global_restart"] * 2
    assert "global restart 2/3 after RuntimeError: rank died" in logged[1]["message"]
    assert "resuming from the checkpoint of step 4" in logged[1]["message"]
    assert events.metrics()["health/global_restarts"] == 2


def test_without_a_checkpoint_the_run_starts_over(base, tmp_path):
    cfg = parse_config(base + ["--use-health-check"])
    resumed, where = resume_config(cfg)
    assert resumed is cfg and where == "the start (no checkpoint under --save yet)"


@pytest.mark.parametrize("flags, error, attempts", [
    ([], RuntimeError("boom"), 1),  # no --use-health-check: the first failure ends the run
    (["--use-health-check", "--max-global-restart", "1"], RuntimeError("boom"), 2),  # then the limit
    (["--use-health-check"], ConfigError("bad flag"), 1),  # the same inputs would fail the same way
])
def test_what_is_not_restarted(base, tmp_path, flags, error, attempts):
    seen = []
    with pytest.raises(type(error)):
        run_with_restarts(parse_config(base + flags), failing(10, error, seen), HealthEvents(str(tmp_path / "run")))
    assert len(seen) == attempts


def test_an_error_from_a_remote_process_is_summarised_by_its_cause():
    class RayTaskError(Exception):  # (the shape of Ray's: the remote error as `cause`, a coloured header)
        def __init__(self, cause):
            super().__init__("\x1b[36mray::ServeReplica:relax-1-actor:actor.handle_request()\x1b[39m (pid=1)")
            self.cause = cause

    error = RayTaskError(RuntimeError("The actor died unexpectedly before finishing this task.\n\tclass_name: X"))
    assert summary(error) == "RuntimeError: The actor died unexpectedly before finishing this task."
