"""Advantages role (fully async, CPU): writes `advantages` onto each step's rows.

It waits until every row of a step has the columns its estimator needs (rewards and masks
from Rollout; `log_probs` from ActorFwd and `ref_log_probs` from Reference when KL reward
shaping is on), then computes the step's advantages with the same function the colocate Actor
uses (`relax.components.actor.batch_advantages`). Whole steps, not groups: REINFORCE++ and
`--normalize-advantages` whiten over the batch, and the step is cheap next to a forward pass.
"""

from __future__ import annotations

import asyncio
from typing import Any

from relax.components.actor import batch_advantages, jagged, uses_critic
from relax.config.schema import RelaxConfig
from relax.distributed import transfer_queue as tq
from relax.utils.logging import setup_logging

POLL_SECONDS = 0.02


def as_list(value: Any) -> Any:
    """A fetched cell (tensor or plain value) as Python data."""
    return value.tolist() if hasattr(value, "tolist") else value


def needed_columns(cfg: RelaxConfig) -> list[str]:
    cols = ["rewards", "loss_masks", "response_lengths"] + (["values"] if uses_critic(cfg) else [])
    if cfg.algo.kl_coef != 0:
        cols += ["ref_log_probs"] + ([] if cfg.algo.use_rollout_logprobs else ["log_probs"])
    return cols


class Advantages:
    def __init__(self, cfg: RelaxConfig) -> None:
        setup_logging()
        self.cfg = cfg
        self.stopping = False

    async def setup(self) -> dict[str, Any]:
        tq.attach()
        return {}

    async def run(self, start: int, end: int) -> None:
        fields = needed_columns(self.cfg)
        for step in range(start, end):
            rows: dict[str, dict[str, Any]] = {}
            while not self.stopping:
                total = await tq.step_rows(step)
                keys, cols = await tq.fetch_ready(step, fields, task="advantages",
                                                  chunk=max(1, self.cfg.rollout.n_samples_per_prompt))
                for i, key in enumerate(keys):
                    rows[key] = {name: cols[name][i] for name in fields}
                if total is not None and len(rows) < total and total - len(rows) < self.cfg.rollout.n_samples_per_prompt:
                    keys, cols = await tq.fetch_ready(step, fields, task="advantages", chunk=total - len(rows))
                    for i, key in enumerate(keys):
                        rows[key] = {name: cols[name][i] for name in fields}
                if total is not None and len(rows) >= total:
                    break
                if not keys:
                    await asyncio.sleep(POLL_SECONDS)
            if self.stopping:
                return
            await self.compute(step, rows)

    async def compute(self, step: int, rows: dict[str, dict[str, Any]]) -> None:
        keys = sorted(rows, key=int)  # sample order, as the Actor reads them: groups contiguous
        batch = {
            "rewards": [float(as_list(rows[k]["rewards"])) for k in keys],
            "loss_masks": [as_list(rows[k]["loss_masks"]) for k in keys],
        }
        if "ref_log_probs" in rows[keys[0]]:
            batch["ref_log_probs"] = [as_list(rows[k]["ref_log_probs"]) for k in keys]
            # Shaping uses the behaviour policy: ActorFwd's log-probs (or the engine's).
            source = "log_probs" if "log_probs" in rows[keys[0]] else None
            if source is None:
                got = await tq.get_columns(step, keys, ["rollout_log_probs"])
                batch["old_log_probs"] = [t.tolist() for t in got["rollout_log_probs"]]
            else:
                batch["old_log_probs"] = [as_list(rows[k][source]) for k in keys]
        if "values" in rows[keys[0]]:  # PPO: GAE on the critic's values; the critic fits the returns
            batch["values"] = [as_list(rows[k]["values"]) for k in keys]
        advantages, returns, _ = batch_advantages(self.cfg, batch)
        columns = {"advantages": jagged(advantages)} | ({"returns": jagged(returns)} if "values" in batch else {})
        await tq.put_columns(step, keys, columns)

    async def shutdown(self) -> None:
        self.stopping = True
