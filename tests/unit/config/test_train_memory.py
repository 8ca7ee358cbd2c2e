"""The weight-copy and memory flags (`relax.config.train_memory`): who keeps how many weight versions
for --keep-old-actor, and the plan notes where a flag has nothing to act on."""

from __future__ import annotations

import pytest

from relax.config import parse_config
from relax.config.plan import resolve_plan, reuses_training_log_probs
from relax.config.roles import Role
from relax.config.status import flag_status
from relax.config.train_memory import TrainMemoryConfig, kept_versions, keeps_old_actor


@pytest.mark.parametrize("flags, actor, actor_fwd", [
    (["--update-weights-interval", "3"], 1, 0),  # colocate: the engines lag; the Actor scores old log-probs
    (["--fully-async", "--max-staleness", "2"], 0, 3),  # ActorFwd scores them: the last S + 1 versions
    ([], 0, 0),  # colocate, engines updated every step: they hold the actor's weights
    (["--fully-async"], 0, 0),  # --max-staleness 0
])
def test_keep_old_actor_keeps_versions_where_the_engines_lag(base, flags, actor, actor_fwd):
    cfg = parse_config(base + ["--keep-old-actor"] + flags)
    assert (kept_versions(cfg, Role.ACTOR), kept_versions(cfg, Role.ACTOR_FWD)) == (actor, actor_fwd)
    assert kept_versions(cfg, Role.REFERENCE) == 0
    assert keeps_old_actor(cfg) == bool(actor or actor_fwd)


def test_kept_weights_replace_the_training_forwards_log_probs(base):
    plain = parse_config(base + ["--update-weights-interval", "2"])
    kept = parse_config(base + ["--update-weights-interval", "2", "--keep-old-actor"])
    assert reuses_training_log_probs(plain) and not reuses_training_log_probs(kept)
    assert resolve_plan(kept).actor.computes[0] == "old_log_probs"


def test_flags_without_anything_to_act_on_get_plan_notes(base):
    notes = resolve_plan(parse_config(base + ["--keep-old-actor", "--train-memory-margin-bytes", "2GB"])).notes
    assert any(n.startswith("--keep-old-actor: no copy kept: colocate with --update-weights-interval 1") for n in notes)
    assert any(n.startswith("--train-memory-margin-bytes: needs CUDA") for n in notes)
    backuper = resolve_plan(parse_config(base + ["--disable-weights-backuper"])).notes
    assert any(n.startswith("--disable-weights-backuper: no host buffers to free") for n in backuper)
    debug = resolve_plan(parse_config(base + ["--check-weight-update-equal", "--debug-rollout-only"])).notes
    assert any("--check-weight-update-equal: no weight push" in n for n in debug)
    assert not [n for n in resolve_plan(parse_config(base)).notes if "keep" in n or "margin" in n]


def test_the_margin_takes_byte_sizes_and_says_it_needs_cuda(base):
    cfg = parse_config(base + ["--train-memory-margin-bytes", "512MB"])
    assert cfg.train_memory.train_memory_margin_bytes == 512 << 20
    assert TrainMemoryConfig().train_memory_margin_bytes == 1 << 30  # slime's default
    import dataclasses

    field = next(f for f in dataclasses.fields(TrainMemoryConfig) if f.name == "train_memory_margin_bytes")
    status, reason = flag_status(field)
    assert status == "needs" and "CUDA GPU" in reason
