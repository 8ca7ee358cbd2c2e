"""--keep-old-actor in the roles that score old log-probs: ActorFwd (fully async) scores each row on
its own weight version's kept copy; the Actor (colocate) on the copy of the version its rows were
generated with, when its ranks have trained past it. And the ranks' spec carries the weight-copy
and memory flags (`training.weights_and_memory`)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from relax.backends.trainer.group import ScoreShard
from relax.components.actor import Actor
from relax.components.actor_fwd import ActorFwd
from relax.components.training import weights_and_memory
from relax.config import parse_config
from relax.config.role_plans import RolePlan
from relax.config.roles import Role


class Group:
    """A trainer group whose log-prob of a row is the weight version it was scored on."""

    dp_size = 1

    def __init__(self) -> None:
        self.calls: list[tuple[int | None, int]] = []

    async def score(self, shards: list[ScoreShard], weights_version: int | None = None) -> list:
        self.calls.append((weights_version, sum(len(s.tokens) for s in shards)))
        return [[[float(weights_version or -1)] * n for n in s.lengths] for s in shards]

    async def pop_compute_seconds(self) -> float:
        return 0.0


def test_actor_fwd_scores_each_row_on_its_own_kept_version():
    fwd = ActorFwd.__new__(ActorFwd)
    fwd.group, fwd.compute_seconds = Group(), 0.0
    tokens, lengths, versions = [[1, 2], [3, 4], [5, 6]], [1, 1, 1], [4, 3, 4]
    logps = asyncio.run(fwd._log_probs(tokens, lengths, versions=versions))
    assert logps == [[4.0], [3.0], [4.0]]
    assert fwd.group.calls == [(3, 1), (4, 2)]  # one pass per version, not per row
    assert asyncio.run(fwd._log_probs(tokens, lengths)) == [[-1.0]] * 3  # without: the live weights


def _actor(keep: int, params_version: int, row_versions: list[int]) -> Actor:
    actor = Actor.__new__(Actor)
    actor.group = SimpleNamespace(spec=SimpleNamespace(keep_weights=keep))
    actor.params_version, actor.row_versions = params_version, row_versions
    return actor


def test_the_actor_scores_on_the_kept_version_once_trained_past_it():
    assert _actor(1, 6, [4])._kept_version() == 4  # --update-weights-interval 2: engines at 4, ranks at 6
    assert _actor(1, 4, [4])._kept_version() is None  # the ranks hold the rows' version themselves
    assert _actor(0, 6, [4])._kept_version() is None  # --keep-old-actor off: the current weights
    with pytest.raises(RuntimeError, match=r"weight versions \[3, 4\]"):
        _actor(1, 6, [3, 4])._kept_version()


def test_the_ranks_spec_carries_the_weight_copy_and_memory_flags(base):
    cfg = parse_config(base + ["--keep-old-actor", "--update-weights-interval", "2", "--check-weight-update-equal",
                               "--train-memory-margin-bytes", "2GB"])
    shared = RolePlan(Role.ACTOR, 1, "rank", slots=((0,),), gpu_fraction=0.5)
    assert weights_and_memory(cfg, shared, policy=True) == {
        "keep_weights": 1, "keep_host_buffers": True, "memory_margin_bytes": 2 << 30, "check_weights": True}
    alone = weights_and_memory(cfg, RolePlan(Role.ACTOR, 1, "rank", slots=((0,),), gpu_fraction=1.0), policy=True)
    assert alone["memory_margin_bytes"] == 0  # the GPU is the trainer's own: no margin to keep
    ref = weights_and_memory(parse_config(base + ["--disable-weights-backuper"]), RolePlan(Role.REFERENCE, 1, "rank"),
                             policy=False)
    assert ref == {"keep_weights": 0, "keep_host_buffers": False, "memory_margin_bytes": 0, "check_weights": False}
