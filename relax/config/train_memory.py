"""The training ranks' weight copies and memory (`TrainMemoryConfig`, one config group of
`schema.RelaxConfig`, kept apart from schema.py for its size), and what the run derives from them.

- `--keep-old-actor` (slime's name: keep the rollout model during training). The PPO ratio divides by
  the old policy's log-probs, which should be those of the weights that generated the rows. Where
  the engines lag the weights old log-probs are computed with, the ranks that compute them keep a
  host copy of the weights the engines were given and score with it (`kept_versions`):
  colocate with --update-weights-interval N > 1 (the engines hold a version up to N - 1 steps old):
  the Actor's ranks keep the version of each engine push; fully async with --max-staleness S > 0
  (ActorFwd holds the newest push, the rows were generated up to S versions earlier): ActorFwd's
  ranks keep the last S + 1 versions and score each row on its own. Elsewhere the engines hold the
  scoring weights already (a plan note says so); with --use-rollout-logprobs (the engine's
  log-probs are the old policy) or partial rollout (a resumed sample has several versions) it is an
  error (`checks.train_memory`).
- `--disable-weights-backuper` (slime: no host backup of the weights, to save host memory). Relax
  keeps no backup to swap models in and out (the Reference is a role of its own, or under LoRA the
  adapters switched off; a push reads the live weights). What it does keep on the host: the pinned
  buffers the colocate offload reuses every step (`relax.backends.trainer.offload.HostStash`), freed
  after each onload with this flag (allocated again at the next offload), and --keep-old-actor's
  copies, which this flag refuses.
- `--train-memory-margin-bytes` (slime: torch_memory_saver's margin when the trainer shares its GPU
  with the engines): on such a GPU each training pass caps the rank's CUDA allocator so that this
  much of the GPU stays free (`relax.backends.trainer.memory_margin`), and fails at once, naming
  the flag, when less is free before it starts. It needs CUDA; on CPU it has no effect.

No torch import (config is a leaf); the functions take the run's `RelaxConfig` (typed `Any`: schema.py
imports this module).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from relax.config.fields import opt, parse_bytes
from relax.config.roles import Role

DEFAULT_MARGIN = 1 << 30


@dataclass(frozen=True)
class TrainMemoryConfig:
    """Weight copies the training ranks keep, and the GPU memory they leave free (docs/weights.md)."""

    keep_old_actor: bool = opt(False, "Old log-probs on the weights that generated the rows: the ranks that score "
                               "them keep a host copy of the weights pushed to the engines (colocate with "
                               "--update-weights-interval > 1: the Actor's; fully async with --max-staleness S > 0: "
                               "ActorFwd's, the last S + 1 versions) instead of scoring on newer ones "
                               "(docs/weights.md).")
    disable_weights_backuper: bool = opt(False, "Save host memory: the colocate offload's pinned host buffers are "
                                         "freed after each onload (allocated again at the next offload); "
                                         "--keep-old-actor's copies are refused (docs/weights.md).")
    train_memory_margin_bytes: int = opt(DEFAULT_MARGIN, "On a GPU shared with the engines (colocate): GPU memory "
                                         "each training pass leaves free (its CUDA allocator is capped; less free "
                                         "before it starts is an error); e.g. 1GB. Needs CUDA.", type=parse_bytes)


def keeps_old_actor(cfg: Any) -> bool:
    """--keep-old-actor acts: engines take weights and may lag the ones old log-probs are computed with."""
    if not cfg.train_memory.keep_old_actor or cfg.debug.debug_train_only or cfg.debug.debug_rollout_only:
        return False
    if cfg.cluster.fully_async:
        return cfg.cluster.max_staleness > 0
    return cfg.rollout.update_weights_interval > 1


def kept_versions(cfg: Any, role: str) -> int:
    """Weight versions `role`'s ranks keep on the host for --keep-old-actor (0: none)."""
    if not keeps_old_actor(cfg):
        return 0
    if cfg.cluster.fully_async:
        return cfg.cluster.max_staleness + 1 if role == Role.ACTOR_FWD else 0
    return 1 if role == Role.ACTOR else 0


def train_memory_notes(cfg: Any, device: str) -> list[str]:
    """Plan notes for these flags (and --check-weight-update-equal) where this run does not act on them."""
    m, notes = cfg.train_memory, []
    if m.keep_old_actor and not keeps_old_actor(cfg):
        if cfg.debug.debug_train_only or cfg.debug.debug_rollout_only:
            why = "no engine takes the actor's weights in a debug run"
        elif cfg.cluster.fully_async:
            why = "--max-staleness 0: every row was generated on the newest weights ActorFwd scores with"
        else:
            why = ("colocate with --update-weights-interval 1: the engines hold the actor's current weights "
                   "whenever old log-probs are computed")
        notes.append(f"--keep-old-actor: no copy kept: {why}")
    if m.disable_weights_backuper and (device == "cpu" or cfg.cluster.fully_async):
        notes.append("--disable-weights-backuper: no host buffers to free: Relax keeps no weight backup, and the "
                     "colocate offload that reuses pinned host buffers runs only on GPUs shared with the engines")
    if m.train_memory_margin_bytes != DEFAULT_MARGIN and device == "cpu":
        notes.append("--train-memory-margin-bytes: needs CUDA: on CPU there is no device memory to reserve")
    if cfg.debug.check_weight_update_equal and (cfg.debug.debug_train_only or cfg.debug.debug_rollout_only):
        notes.append("--check-weight-update-equal: no weight push to check in a debug run")
    return notes
