"""The run's checkpoints on the Controller's side: every checkpointing role writes its part (the
Actor's and the Critic's ranks, the Rollout's data position), then the checkpoint is committed
(`relax.utils.checkpoints.commit`: the manifest, then the pointer) and old ones are pruned.

With --async-save a role's `save` returns once its ranks hold a host copy of their state; they
write it while training goes on. The checkpoint is committed only when every role's `finish_save`
has returned (the part is written and in place), which happens before the next checkpoint starts,
at the end of the run, and when the run stops (so a restart resumes from it). A crash mid-write
therefore leaves the previous checkpoint as the latest, and a failed write is raised at the next
checkpoint or at the end of the run, never lost.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from relax.config.schema import CheckpointConfig
from relax.utils import checkpoints


class Checkpointer:
    """`save(step)` after the steps due a checkpoint, `finish()` at the end. `roles`: the role handles
    that checkpoint (each with `save(step) -> parts` and `finish_save()`)."""

    def __init__(self, cfg: CheckpointConfig, roles: list[Any]) -> None:
        self.cfg, self.roles = cfg, roles
        self.pending: tuple[int, dict[str, str]] | None = None  # (step, parts) not committed yet

    async def save(self, step: int) -> None:
        """Every role writes (or with --async-save starts writing) its part of step `step`'s
        checkpoint, after the previous checkpoint is finished."""
        await self.finish()
        parts: dict[str, str] = {}
        for role in self.roles:
            parts |= await role.save(step)
        self.pending = (step, parts)
        if not self.cfg.async_save:
            await self.finish()

    async def finish(self) -> None:
        """Wait until every part of the checkpoint being written is in place, then commit it and prune
        the old ones. A failed write raises here; that checkpoint is not committed."""
        if self.pending is None:
            return
        (step, parts), self.pending = self.pending, None
        results = await asyncio.gather(*(role.finish_save() for role in self.roles), return_exceptions=True)
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:
            raise RuntimeError(f"--async-save: writing the checkpoint of step {step} failed, so it was not "
                               f"committed (the latest checkpoint is the one before it): {failed[0]!r}") from failed[0]
        checkpoints.commit(self.cfg.save, step, parts)
        self._prune(step, parts)

    def _prune(self, step: int, parts: dict[str, str]) -> None:
        c = self.cfg
        for name in ("actor", "critic"):
            if name in parts and c.rotate_ckpt:  # every step saved; the latest and the interval ones stay
                checkpoints.prune_rotated(os.path.dirname(parts[name]), c.save_interval, c.max_actor_ckpt_to_keep,
                                          protect=step)
            elif name in parts:
                checkpoints.prune(os.path.dirname(parts[name]), c.max_actor_ckpt_to_keep, protect=step)
