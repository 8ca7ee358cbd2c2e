"""ActorFwd / Reference role: forward-only log-probs written back onto the step's rows.

As Reference it loads `--ref-load` (default `--hf-checkpoint`) once and writes
`ref_log_probs` for every row of partition `train_{step}`, which the Actor reads for the KL
loss. The same class serves as ActorFwd (old-policy log-probs) in fully-async mode.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from relax.components.actor import make_worker_group, shard_rows
from relax.config.schema import RelaxConfig
from relax.distributed import transfer_queue as tq
from relax.utils.logging import setup_logging


class ActorFwd:
    def __init__(self, cfg: RelaxConfig, role: str = "reference") -> None:
        setup_logging()
        self.cfg, self.role = cfg, role
        self.column = "ref_log_probs" if role == "reference" else "log_probs"
        self.group = None

    async def setup(self) -> dict[str, Any]:
        tq.attach()
        model_path = self.cfg.ckpt.ref_load or self.cfg.ckpt.hf_checkpoint
        n = (self.cfg.cluster.resource.get(self.role) or [1, 1])[1] or 1
        self.group = make_worker_group(self.cfg, "reference", model_path, n)
        return {}

    async def forward(self, rollout_id: int) -> dict[str, float]:
        start = time.perf_counter()
        keys = await tq.list_keys(rollout_id)
        cols = await tq.get_columns(rollout_id, keys, ["tokens", "response_lengths"])
        tokens = [t.tolist() for t in cols["tokens"]]
        lengths = cols["response_lengths"].tolist()
        world = self.group.world_size
        shards_idx = shard_rows(len(tokens) - len(tokens) % world, 1, world)
        shards_idx[-1].extend(range(sum(map(len, shards_idx)), len(tokens)))
        shards = [{"tokens": [tokens[i] for i in idx], "response_lengths": [lengths[i] for i in idx]}
                  for idx in shards_idx]
        results = await self.group.call_sharded("compute_log_probs", shards)
        compute = max(await self.group.call("pop_compute_seconds"))
        logps: list[list[float]] = [[] for _ in tokens]
        for idx, res in zip(shards_idx, results):
            for i, lp in zip(idx, res):
                logps[i] = lp
        column = torch.nested.nested_tensor([torch.tensor(lp, dtype=torch.float32) for lp in logps],
                                            layout=torch.jagged)
        await tq.put_columns(rollout_id, keys, {self.column: column})
        return {f"time/{self.role}": time.perf_counter() - start, f"compute/{self.role}_seconds": compute}

    async def shutdown(self) -> None:
        if self.group is not None:
            await self.group.call("shutdown")
            self.group.kill()
            self.group = None
