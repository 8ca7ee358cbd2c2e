"""Advantages role (fully async, CPU): writes `advantages` onto each step's rows.

It reads rows as they get the columns its estimator needs (its plan's `reads`: rewards and
masks from Rollout; `old_log_probs` from ActorFwd and `ref_log_probs` from Reference when KL
reward shaping is on) and computes advantages with the same function the colocate Actor uses
(`relax.components.step_advantages.step_advantages`). When a group's advantages depend on that group
alone (GRPO-family estimators, GAE) each group is written as soon as its rows are in, so the
Actor's streaming loader can start on it; REINFORCE++(-baseline) and `--normalize-advantages`
whiten over the batch, so they wait for the whole step.
"""

from __future__ import annotations

from typing import Any

from relax.components.setup_context import SetupContext
from relax.components.step_advantages import AdvantageSpec, final_rows, jagged, step_advantages
from relax.config.plan import RolePlan, per_group_advantages
from relax.config.schema import RelaxConfig
from relax.distributed import transfer_queue as tq


def as_list(value: Any) -> Any:
    """A fetched cell (tensor or plain value) as Python data."""
    return value.tolist() if hasattr(value, "tolist") else value


def complete_groups(rows: dict[str, dict[str, Any]], group_size: int) -> list[list[str]]:
    """Keys of every group with all `group_size` episodes present (by `group_indices`), in key order:
    each episode's scored row and, when rows carry `episode_rows`, every row of its prior segments.
    Rows without a group (index -1, e.g. from a custom conversion) never form one."""
    groups: dict[int, list[str]] = {}
    for key, row in rows.items():
        g = int(as_list(row["group_indices"]))
        if g >= 0:
            groups.setdefault(g, []).append(key)
    return [sorted(keys, key=int) for _, keys in sorted(groups.items()) if _complete(rows, keys, group_size)]


def _complete(rows: dict[str, dict[str, Any]], keys: list[str], group_size: int) -> bool:
    if "episode_rows" not in rows[keys[0]]:
        return len(keys) == group_size
    scored = [k for k in keys if int(as_list(rows[k]["episode_indices"])) == int(k)]
    return len(scored) == group_size and sum(int(as_list(rows[k]["episode_rows"])) for k in scored) == len(keys)


class Advantages:
    def __init__(self, cfg: RelaxConfig, plan: RolePlan) -> None:
        tq.start_replica()
        self.cfg, self.plan = cfg, plan
        self.spec = AdvantageSpec.from_config(cfg)
        self.stopping = False

    async def setup(self, ctx: SetupContext) -> SetupContext:
        return ctx

    async def run(self, start: int, end: int) -> None:
        fields = [c for c in self.plan.reads if c != "sample_indices"]
        n, local = self.cfg.rollout.n_samples_per_prompt, per_group_advantages(self.cfg)
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

        def column(name: str) -> list[Any] | None:
            return [as_list(rows[k][name]) for k in keys] if name in self.plan.reads else None

        # KL shaping and the OPD penalty use the behaviour policy: ActorFwd's log-probs (or the engine's).
        advantages, returns = step_advantages(
            self.spec, [float(r) for r in column("rewards")], column("loss_masks"),
            old_log_probs_RT=column("old_log_probs") or column("rollout_log_probs"),
            ref_log_probs_RT=column("ref_log_probs"), teacher_log_probs_RT=column("teacher_log_probs"),
            values_RT=column("values"),  # PPO: GAE on the critic's values; the critic fits the returns
            final_of_R=final_rows([int(k) for k in keys], column("episode_indices")))
        outputs = {"advantages": advantages, "returns": returns}
        await tq.put_columns(step, keys, {name: jagged(outputs[name]) for name in self.plan.writes})

    async def shutdown(self) -> None:
        self.stopping = True
