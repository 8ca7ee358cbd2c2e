"""Critic role (PPO): a value model, trained on the GAE returns of every step.

When the plan streams it (fully async), `run()` writes values onto rows as Rollout writes
them, the Advantages role computes GAE advantages and returns, and `train(k)` runs after the
Actor trained step k.

Data flow of one colocate step (`--advantage-estimator ppo`):

    critic.forward(k)  values (response-aligned, current critic) onto every row of train_{k}
    actor.train(k)     reads them, runs GAE (`relax.algorithms.advantages.gae`, reward at the
                       last response token, --gamma/--lambd), trains the policy on the
                       advantages (not during --num-critic-only-steps / --critic-train-only) and
                       writes the `returns` onto the rows
    critic.train(k)    clipped value loss (--value-clip around the forward's values) on
                       values/returns, then clears the partition: it is the step's last consumer

GAE runs once per step (in the Actor, or in the Advantages role when it streams), with the
same function (`step_advantages`); the critic therefore fits exactly the returns the policy's
advantages came from. The model is the training backend's "value" head: the causal-LM
body of --hf-checkpoint with a new scalar head, or a critic checkpoint from --critic-load
(default <--load>/critic). It has its own AdamW with --critic-lr (default --lr) and
--critic-lr-warmup-iters, and saves to --critic-save (default <--save>/critic) with the actor.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from typing import Any

from relax.components.actor_fwd import stream_steps
from relax.components.setup_context import SetupContext
from relax.components.step_advantages import jagged
from relax.components.training import (
    CheckpointPart, make_trainer_group, mean_over_ranks, optimizer_steps_total, read_rows, score_rows,
    train_on_rows, trainer_checkpoint,
)
from relax.config.plan import RolePlan
from relax.config.schema import OptimizerConfig, RelaxConfig
from relax.distributed import transfer_queue as tq
from relax.types import TrainBatch

logger = logging.getLogger(__name__)


def critic_optim(cfg: RelaxConfig) -> OptimizerConfig:
    """The actor's optimizer settings with the critic's learning rate and warm-up."""
    lr = cfg.algo.critic_lr if cfg.algo.critic_lr is not None else cfg.optim.lr
    return dataclasses.replace(cfg.optim, lr=lr, lr_warmup_iters=cfg.algo.critic_lr_warmup_iters)


def critic_dirs(cfg: RelaxConfig) -> tuple[str | None, str | None]:
    """(load, save) directories of critic checkpoints: the flags, else a `critic/` folder under
    --load / --save (the actor's own checkpoints live next to it)."""
    c = cfg.ckpt
    load = c.critic_load or (os.path.join(c.load, "critic") if c.load else None)
    save = c.critic_save or (os.path.join(c.save, "critic") if c.save else None)
    return load, save


class Critic:
    def __init__(self, cfg: RelaxConfig, plan: RolePlan) -> None:
        tq.start_replica()
        self.cfg, self.plan = cfg, plan
        self.group = None
        self.ckpt: CheckpointPart | None = None  # `start`

    async def start(self) -> None:
        cfg = self.cfg
        self.group = make_trainer_group(cfg, self.plan, cfg.ckpt.hf_checkpoint, head="value",
                                        total_steps=optimizer_steps_total(cfg), optim=critic_optim(cfg))
        await self.group.ready()
        self.ckpt = CheckpointPart(self.group, background=cfg.ckpt.async_save)

    async def offload(self) -> dict[str, float]:
        """Colocate on shared GPUs: this role's ranks move their state to the host (rollout runs)."""
        return await self.group.move(to_host=True)

    async def onload(self) -> dict[str, float]:
        return await self.group.move(to_host=False)

    async def setup(self, ctx: SetupContext) -> SetupContext:
        """Load the critic's part of the checkpoint the run resumes from, or the latest one under an
        explicit --critic-load."""
        cfg = self.cfg
        point = ctx.resume
        if cfg.ckpt.critic_load:
            ckpt = trainer_checkpoint(cfg.ckpt.critic_load)
        elif point is not None and "critic" in point.parts:
            ckpt = point.parts["critic"]
        else:
            ckpt = None  # fresh: --hf-checkpoint plus a new value head
        if ckpt is None:
            return dataclasses.replace(ctx, critic_loaded_rollout_id=None)
        meta = await self.group.load(str(ckpt))
        logger.info("critic loaded %s (rollout %d)", ckpt, meta["rollout_id"])
        return dataclasses.replace(ctx, critic_loaded_rollout_id=meta["rollout_id"])

    async def forward(self, rollout_id: int) -> dict[str, float]:
        """Write `values` onto every row of the step."""
        start = time.perf_counter()
        keys, tokens, lengths, _ = await read_rows(rollout_id)
        values, compute = await score_rows(self.group, tokens, lengths)
        await tq.put_columns(rollout_id, keys, {"values": jagged(values)})
        return {"time/critic_forward": time.perf_counter() - start, "compute/critic_forward_seconds": compute}

    async def run(self, start: int, end: int) -> None:
        """Fully async: write `values` onto rows as Rollout writes them (the critic's current
        weights; it trains on step k after the Actor, while later steps are being scored)."""
        async def score(step: int, keys: list[str], cols: dict[str, Any]) -> None:
            values, _ = await score_rows(self.group, [t.tolist() for t in cols["tokens"]],
                                         [int(x) for x in cols["response_lengths"]])
            await tq.put_columns(step, keys, {"values": jagged(values)})

        await stream_steps(start, end, task="critic", chunk=self.cfg.rollout.n_samples_per_prompt,
                           fields=["tokens", "response_lengths"], score=score,
                           alive=lambda: self.group is not None)

    async def train(self, rollout_id: int) -> dict[str, float]:
        """Value-loss steps on the rows' values and returns; clears the partition."""
        start = time.perf_counter()
        keys = await tq.list_keys(rollout_id)
        if not keys:  # --debug-rollout-only: the actor consumed the step untrained
            return {}
        fields = ["tokens", "response_lengths", "loss_masks", "values", "returns"]
        cols = await tq.get_columns(rollout_id, keys, fields)
        batch = TrainBatch(tokens_RL=[t.tolist() for t in cols["tokens"]],
                           response_lengths_R=cols["response_lengths"].tolist(),
                           loss_masks_RT=[m.tolist() for m in cols["loss_masks"]],
                           values_RT=[v.tolist() for v in cols["values"]],
                           returns_RT=[r.tolist() for r in cols["returns"]])
        async with self.group.profiled_step():  # a step of the ranks' profilers (--use-pytorch-profiler)
            results = await train_on_rows(self.group, batch, self.cfg.batch.global_batch_size)
        metrics = {"compute/critic_train_seconds": max(r.pop("compute_seconds") for r in results)}
        metrics |= mean_over_ranks(results, prefix="critic")
        await tq.clear(rollout_id)
        return metrics | {"time/critic_train": time.perf_counter() - start}

    async def save(self, rollout_id: int) -> dict[str, str]:
        _, save_dir = critic_dirs(self.cfg)
        if save_dir is None:
            return {}
        return {"critic": await self.ckpt.save(save_dir, rollout_id, save_optim=not self.cfg.ckpt.no_save_optim)}

    async def finish_save(self) -> None:
        """--async-save: wait for the critic part being written and move it into place."""
        await self.ckpt.finish()

    async def shutdown(self) -> None:
        if self.group is not None:
            group, self.group = self.group, None
            await group.shutdown()
