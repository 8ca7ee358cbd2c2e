"""Advantages role (fully async, CPU): writes `advantages` onto each step's rows.

It reads rows as they get the columns its estimator needs (rewards and masks from Rollout;
`log_probs` from ActorFwd and `ref_log_probs` from Reference when KL reward shaping is on) and
computes advantages with the same function the colocate Actor uses
(`relax.components.actor.batch_advantages`). When a group's advantages depend on that group
alone (GRPO-family estimators, GAE) each group is written as soon as its rows are in, so the
Actor's streaming loader can start on it; REINFORCE++(-baseline) and `--normalize-advantages`
whiten over the batch, so they wait for the whole step.
"""

from __future__ import annotations

from typing import Any

from relax.algorithms.advantages import BATCH_ESTIMATORS
from relax.components.actor import batch_advantages, jagged, uses_critic
from relax.config.schema import RelaxConfig
from relax.distributed import transfer_queue as tq
from relax.utils.logging import setup_logging


def as_list(value: Any) -> Any:
    """A fetched cell (tensor or plain value) as Python data."""
    return value.tolist() if hasattr(value, "tolist") else value


def per_group(cfg: RelaxConfig) -> bool:
    """Whether a group's advantages depend on its own rows only (no batch whitening)."""
    return cfg.algo.advantage_estimator not in BATCH_ESTIMATORS and not cfg.algo.normalize_advantages


def complete_groups(rows: dict[str, dict[str, Any]], group_size: int) -> list[list[str]]:
    """Keys of every group with all `group_size` rows present (by `group_indices`), in key order.
    Rows without a group (index -1, e.g. from a custom conversion) never form one."""
    groups: dict[int, list[str]] = {}
    for key, row in rows.items():
        g = int(as_list(row["group_indices"]))
        if g >= 0:
            groups.setdefault(g, []).append(key)
    return [sorted(keys, key=int) for _, keys in sorted(groups.items()) if len(keys) == group_size]


def needed_columns(cfg: RelaxConfig) -> list[str]:
    cols = ["rewards", "loss_masks", "response_lengths", "group_indices"] + (["values"] if uses_critic(cfg) else [])
    old_policy = [] if cfg.algo.use_rollout_logprobs else ["log_probs"]
    if cfg.algo.kl_coef != 0:  # KL reward shaping: behaviour policy against the reference
        cols += ["ref_log_probs"] + old_policy
    if cfg.algo.use_opd:  # the OPD penalty: behaviour policy against the teacher
        cols += ["teacher_log_probs"] + old_policy
    return list(dict.fromkeys(cols))


class Advantages:
    def __init__(self, cfg: RelaxConfig) -> None:
        setup_logging()
        self.cfg = cfg
        self.stopping = False

    async def setup(self) -> dict[str, Any]:
        tq.attach()
        return {}

    async def run(self, start: int, end: int) -> None:
        fields, n = needed_columns(self.cfg), self.cfg.rollout.n_samples_per_prompt
        local = per_group(self.cfg)
        for step in range(start, end):
            rows: dict[str, dict[str, Any]] = {}  # read, advantages not yet written

            async def take(keys: list[str], cols: dict[str, Any], step: int = step) -> None:
                for i, key in enumerate(keys):
                    rows[key] = {name: cols[name][i] for name in fields}
                for group in complete_groups(rows, n) if local else []:
                    await self.compute(step, {k: rows.pop(k) for k in group})

            await tq.stream_step(step, task="advantages", chunk=n, fields=fields, score=take,
                                 alive=lambda: not self.stopping)
            if self.stopping:
                return
            if rows:  # the whole step (batch estimators), or rows outside any full group
                await self.compute(step, rows)

    async def compute(self, step: int, rows: dict[str, dict[str, Any]]) -> None:
        keys = sorted(rows, key=int)  # sample order, as the Actor reads them: groups contiguous
        batch = {
            "rewards": [float(as_list(rows[k]["rewards"])) for k in keys],
            "loss_masks": [as_list(rows[k]["loss_masks"]) for k in keys],
        }
        first = rows[keys[0]]
        for name in ("ref_log_probs", "teacher_log_probs"):
            if name in first:
                batch[name] = [as_list(rows[k][name]) for k in keys]
        # KL shaping and the OPD penalty use the behaviour policy: ActorFwd's log-probs (or the engine's).
        if "log_probs" in first:
            batch["old_log_probs"] = [as_list(rows[k]["log_probs"]) for k in keys]
        elif "ref_log_probs" in first or "teacher_log_probs" in first:
            got = await tq.get_columns(step, keys, ["rollout_log_probs"])
            batch["old_log_probs"] = [t.tolist() for t in got["rollout_log_probs"]]
        if "values" in rows[keys[0]]:  # PPO: GAE on the critic's values; the critic fits the returns
            batch["values"] = [as_list(rows[k]["values"]) for k in keys]
        advantages, returns, _ = batch_advantages(self.cfg, batch)
        columns = {"advantages": jagged(advantages)} | ({"returns": jagged(returns)} if "values" in batch else {})
        await tq.put_columns(step, keys, columns)

    async def shutdown(self) -> None:
        self.stopping = True
