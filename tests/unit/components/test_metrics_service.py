"""The metrics role without Serve: a step's row merges the roles' reports with the Controller's,
late reports get a row of their own, and the flags map onto the sinks' config."""

from __future__ import annotations

import asyncio
import json


from relax.components.metrics import MetricsService, run_flags, sink_config
from relax.config import parse_config
from relax.config.plan import RolePlan


def test_a_closed_step_merges_what_every_role_reported(base, tmp_path):
    service = MetricsService(parse_config(base + ["--use-metrics-service"]), RolePlan("metrics"))

    async def steps():
        await service.report(0, "reference", {"stream/reference_seconds": 0.5})
        await service.report(1, "actor_fwd", {"stream/actor_fwd_seconds": 0.25})  # ahead: kept for step 1
        await service.log(0, "controller", {"time/step": 2.0, "export/hf_path": "/x"})
        await service.report(0, "advantages", {"stream/advantages_seconds": 0.125})  # late: a row of its own
        await service.log(1, "controller", {"time/step": 3.0})
        await service.report(2, "reference", {"stream/reference_seconds": 0.75})  # never closed
        await service.shutdown()

    asyncio.run(steps())
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert rows == [{"step": 0, "stream/reference_seconds": 0.5, "time/step": 2.0},
                    {"step": 0, "stream/advantages_seconds": 0.125},
                    {"step": 1, "stream/actor_fwd_seconds": 0.25, "time/step": 3.0},
                    {"step": 2, "stream/reference_seconds": 0.75}]


def test_tensorboard_wandb_and_clearml_names_come_from_the_tb_flags(base, tmp_path):
    cfg = parse_config(base + ["--tb-project-name", str(tmp_path / "tb" / "gsm8k-grpo"),
                               "--tb-experiment-name", "qwen-lr1e-6"])
    sinks = sink_config(cfg)
    assert sinks.tb_dir == str(tmp_path / "tb" / "gsm8k-grpo" / "qwen-lr1e-6")
    assert (sinks.project, sinks.name) == ("gsm8k-grpo", "qwen-lr1e-6")
    assert sinks.run_config["rollout_batch_size"] == 4


def test_without_tb_flags_the_run_directory_names_the_run(base, tmp_path, monkeypatch):
    monkeypatch.delenv("TENSORBOARD_DIR", raising=False)
    sinks = sink_config(parse_config(base))
    assert sinks.tb_dir.rstrip("/") == str(tmp_path / "run" / "tb")
    assert (sinks.project, sinks.name) == (None, "run")


def test_run_flags_leave_out_alert_urls(base):
    cfg = parse_config(base + ["--notify-urls", "json://127.0.0.1:9/x"])
    flags = run_flags(cfg)
    assert "notify_urls" not in flags and flags["rollout_batch_size"] == 4
