"""Tier 2 (global restart) decisions and the health event log, without Ray: which failures restart
the run, from where, how often; and what an event leaves behind (log file, counters)."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest

from relax.config import ConfigError, parse_config
from relax.config.schema import RelaxConfig
from relax.core import health
from relax.core.health import HealthEvents, HealthManager, resume_config, run_with_restarts, summary
from relax.utils import checkpoints
from relax.utils.metrics_sinks import JsonlSink, SinkConfig


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
    resumed, where, step = resume_config(cfg)
    assert resumed is cfg and where == "the start (no checkpoint under --save yet)" and step is None


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


def test_a_restart_leaves_one_row_per_step_in_the_metrics_log(base, tmp_path):
    """The resumed attempt's rows replace the failed attempt's for the steps it redoes: those move to
    metrics.jsonl.attempt-<n>; rows of an earlier run in the same directory are left alone."""
    cfg = parse_config(base + ["--use-health-check"])
    log = tmp_path / "run" / "metrics.jsonl"
    log.parent.mkdir()
    log.write_text('{"step": 7, "earlier": 1}\n')  # another run's, before this one

    def attempt(c):
        sink = JsonlSink(SinkConfig(exp_dir=cfg.misc.exp_dir))
        first = c.ckpt.load is None
        for step in range(0 if first else 2, 4):
            if first and step == 3:  # checkpoint after step 1, steps 2 logged, step 3 half written, then a crash
                sink.file.write('{"step": 3, "train/los')
                sink.close()
                raise RuntimeError("rank died")
            sink.log(step, {"attempt": 1.0 if first else 2.0})
            if first and step == 1:
                checkpoints.commit(str(tmp_path / "ckpt"), 1, {})
        sink.close()

    events = HealthEvents(cfg.misc.exp_dir)
    run_with_restarts(cfg, attempt, events)
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(r["step"], r.get("attempt")) for r in rows] == [(7, None), (0, 1.0), (1, 1.0), (2, 2.0), (3, 2.0)]
    side = (tmp_path / "run" / "metrics.jsonl.attempt-1").read_text().splitlines()
    assert side == ['{"step": 2, "attempt": 1.0}', '{"step": 3, "train/los']  # the torn row goes there too
    restart = json.loads((tmp_path / "run" / "health_events.jsonl").read_text())
    assert restart["superseded_steps"] == [2]
    assert "attempt's rows of steps [2] and 1 row(s) cut short moved to metrics.jsonl.attempt-1" in restart["message"]


class Slept(Exception):
    """Ends the monitor once it has slept twice."""


@pytest.mark.parametrize("first_wait", [0.0, 45.0])
def test_rollout_health_check_first_wait_delays_the_first_check(monkeypatch, tmp_path, first_wait):
    slept = []

    async def sleep(seconds):
        slept.append(seconds)
        if len(slept) == 2:
            raise Slept

    monkeypatch.setattr(health.asyncio, "sleep", sleep)
    cfg = RelaxConfig().replace(use_fault_tolerance=True, rollout_health_check_first_wait=first_wait,
                                rollout_health_check_interval=5.0)
    manager = HealthManager(cfg, SimpleNamespace(roles=[]), {}, HealthEvents(str(tmp_path)), None)
    with pytest.raises(Slept):
        asyncio.run(manager._monitor())
    assert slept == [first_wait, 5.0]  # the start-up wait, then the interval before each round of checks
