"""The metrics role as a Serve deployment: a role's report and the Controller's step row reach its
sinks (the JSONL log and an offline W&B run, written in the replica's process)."""

from __future__ import annotations

import asyncio
import json

import pytest

pytestmark = pytest.mark.integration


def test_reports_from_roles_and_the_controller_reach_the_service_sinks(ray_cluster, tiny_setup, tmp_path):
    from relax.config import parse_config
    from relax.core.controller import RoleHandle
    from relax.core.metrics import ServiceMetrics
    from relax.core.service import Runtime
    from relax.utils.metrics import MetricsReporter

    pytest.importorskip("wandb")
    exp_dir = tmp_path / "run"
    cfg = parse_config(["--hf-checkpoint", str(tiny_setup / "model"), "--prompt-data", str(tiny_setup / "train.jsonl"),
                        "--input-key", "prompt", "--label-key", "label", "--rollout-batch-size", "2",
                        "--num-rollout", "1", "--rollout-max-response-len", "4", "--exp-dir", str(exp_dir),
                        "--use-metrics-service", "--use-wandb"])
    with Runtime(cfg) as runtime:
        role = runtime.plan.role("metrics")
        service = RoleHandle(runtime.deploy_role(role, cfg, role, wait=True))
        MetricsReporter("reference").report(0, {"stream/reference_seconds": 0.5})  # as a role process does

        async def controller() -> None:
            metrics = ServiceMetrics(service)
            await metrics.log(0, {"time/step": 2.0, "rollout/reward_mean": 0.25})
            await service.shutdown()  # closes the sinks, as Controller.shutdown does
            assert not metrics.failed

        asyncio.run(controller())
    keys: dict[str, float] = {}
    for line in (exp_dir / "metrics.jsonl").read_text().splitlines():  # merged, or a late row of its own
        row = json.loads(line)
        assert row.pop("step") == 0
        keys |= row
    assert keys == {"stream/reference_seconds": 0.5, "time/step": 2.0, "rollout/reward_mean": 0.25}
    assert list(exp_dir.glob("wandb/offline-run-*/run-*.wandb"))  # no credentials here: W&B logged offline
