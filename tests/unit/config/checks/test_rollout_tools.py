"""The rollout's tool flags checked before Ray starts (`relax.config.checks.rollout_tools`):
--polling-mode (TransferQueue's blocking fetch is refused with the reason) and --use-distributed-post
(accepted with a note saying why it has no effect here). The others are tested where they act:
tests/unit/engine/router/test_slime_router.py, tests/unit/engine/rollout/test_engine_profiling.py,
tests/unit/engine/rollout/test_step_logs.py, tests/unit/engine/rewards/test_remote_rm_proxy.py."""

from __future__ import annotations

import inspect

import pytest

from relax.config import ConfigError, parse_config
from relax.config.checks.flags import ignored_flag_notes
from relax.config.plan import resolve_plan


def test_polling_mode_is_the_data_system_s_mode_and_false_is_refused_with_the_reason(base):
    from relax.distributed.transfer_queue import init_data_system

    assert parse_config(base + ["--polling-mode", "true"]).cluster.polling_mode is True
    assert inspect.signature(init_data_system).parameters["polling_mode"].default is True  # the run passes the flag
    with pytest.raises(ConfigError, match=r"--polling-mode false asks for TransferQueue's blocking fetch.*5 s sleep"):
        parse_config(base + ["--polling-mode", "false"])


def test_use_distributed_post_is_accepted_with_the_reason_it_has_no_effect_here(base):
    cfg = parse_config(base + ["--use-distributed-post"])
    (note,) = ignored_flag_notes(cfg)
    assert note.startswith("--use-distributed-post: accepted and ignored: slime spreads its rollout HTTP posts")
    assert any("--use-distributed-post" in n for n in resolve_plan(cfg).notes)
