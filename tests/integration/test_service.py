"""The Runtime's Serve plumbing: roles deployed side by side, a role whose replica cannot start
fails the run with its constructor's error, and teardown deletes every app of the run."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration


def test_a_role_that_cannot_start_raises_its_error_and_teardown_deletes_every_app(ray_cluster, tiny_setup):
    from ray import serve

    from relax.config import parse_config
    from relax.config.plan import RolePlan
    from relax.core.service import Runtime
    from relax.distributed.ray.serve_apps import app_states

    cfg = parse_config(["--hf-checkpoint", str(tiny_setup / "model"), "--prompt-data", str(tiny_setup / "train.jsonl"),
                        "--input-key", "prompt", "--label-key", "label", "--rollout-batch-size", "2",
                        "--num-rollout", "1", "--rollout-max-response-len", "4"])
    with Runtime(cfg) as runtime:
        runtime.deploy_role(RolePlan("advantages"), cfg, RolePlan("advantages", reads=("rewards",)))
        broken = RolePlan("actor_fwd", writes=("old_log_probs", "ref_log_probs"))  # its constructor raises
        runtime.deploy_role(broken, cfg, broken)
        with pytest.raises(RuntimeError, match="(?s)failed to start.*ActorFwd writes one log-prob column"):
            runtime.wait_running(timeout_s=120)
        apps = list(runtime.apps)
        assert len(apps) == 2 and runtime.failed_apps == {apps[1]}  # the controller skips its shutdown
        # The cheap read of the apps' states (relax.distributed.ray.serve_apps) says what serve.status() says.
        states, public = app_states(), serve.status().applications
        assert {n: s.status for n, s in states.items()} == {n: a.status.value for n, a in public.items()}
        failed = states[apps[1]]
        assert failed.failed and any("ActorFwd writes one log-prob column" in m for m in failed.messages)
    assert not set(apps) & set(serve.status().applications) and not set(apps) & set(app_states())
