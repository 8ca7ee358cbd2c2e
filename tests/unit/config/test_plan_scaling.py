"""`--dry-run` shows where the scaling REST API will listen (served by the Rollout role) and what the
autoscaler will do; a run with no engines to scale (or --scale-api false) serves none."""

from __future__ import annotations

from relax.config import parse_config
from relax.config.plan import format_plan, resolve_plan


def plan_text(args: list[str]) -> str:
    cfg = parse_config(args)
    return format_plan(resolve_plan(cfg, 0), cfg)


def test_the_plan_shows_the_scaling_api_and_the_autoscaler(base, tmp_path):
    (tmp_path / "a.yaml").write_text("min_engines: 1\nmax_engines: 3\ncooldown_s: 30\n")
    text = plan_text(base + ["--autoscaler-config", str(tmp_path / "a.yaml")])
    assert ("scaling API: http://127.0.0.1:<free port>, served by the Rollout role (bearer token in "
            "<outputs>/.relax/scale_token") in text
    assert f"autoscaler: {tmp_path / 'a.yaml'}: 1-3 engines, trainer_wait > 0.3 grows" in text
    assert "cooldown 30s" in text
    assert "scaling API: http://10.0.0.5:8123" in plan_text(base + ["--scale-api-host", "10.0.0.5",
                                                                    "--scale-api-port", "8123"])


def test_no_scaling_api_when_turned_off_or_without_engines(base):
    assert "scaling API" not in plan_text(base + ["--scale-api", "false"])
    assert "scaling API" not in plan_text(base + ["--debug-train-only", "--load-debug-rollout-data", "/x/{rollout_id}"])
