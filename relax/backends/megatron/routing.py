"""Routing replay on megatron-core's MoE routers (docs/moe.md): rows' recorded experts replayed in
every forward, under tensor (sequence), context, expert and pipeline parallelism.

megatron-core's `TopKRouter` computes its top-k through the object in `router.router_replay`
(`topk_routing_with_score_function`: `router_replay.get_replay_topk(scores, topk, num_groups,
group_topk, default_compute_topk)`; megatron-core >= 0.16). `ReplayTopK` stands in for megatron's
own `RouterReplay` (whose static list of instances outlives the model): it computes the router's own
top-k, swaps in the recorded ids of the tokens a record covers, and returns the router's scores at
those ids, which the router (`moe_router_pre_softmax=False`, `model.py`) turns into gate weights
by a softmax over the selected experts: Qwen3-MoE's normalised top-k gating, gradients reaching
the router. It also keeps the ids it used, for `--use-routing-replay`'s recording forward.

Token order: a router sees this rank's hidden states `[S, B, H]` flattened sequence-major, S being
its share of the padded micro-batch: context parallelism keeps 2 of 2C chunks of each row
(`attention.cp_positions`), sequence parallelism a 1/TP slice of that; expert parallelism routes
before tokens leave the rank and a pipeline stage holds its own layers (`layer_number`), so the
targets are laid out here (`arm`) exactly as the router reads them. Recording (`recorded`) reads
them back per row; it is built for micro-batches a rank holds whole (no TP/CP split: the config
check rejects `--use-routing-replay` alone there; R3 needs no recording).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import torch

from relax.utils.routing import RoutingShape
from relax.utils.routing_replay import merged_ids, rows_from_batch, targets_for_rows

# The rank this module serves (relax.backends.megatron.rank.MegatronRank, which builds a
# MegatronRouting: typed loosely here so the two modules do not import each other).
MegatronRank = Any


class ReplayTopK:
    """One router's replay (module doc): `target` `[N, top_k]` at the `covered` `[N]` tokens."""

    def __init__(self) -> None:
        self.target: torch.Tensor | None = None
        self.covered: torch.Tensor | None = None
        self.record = False
        self.used: torch.Tensor | None = None

    def get_replay_topk(self, scores: torch.Tensor, topk: int, num_groups: Any = None, group_topk: Any = None,
                        default_compute_topk: Callable[..., Any] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        probs, ids = default_compute_topk(scores, topk, num_groups=num_groups, group_topk=group_topk)
        if self.target is not None:
            ids = merged_ids(ids, self.target, self.covered)
            probs = scores.gather(1, ids)
        if self.record:
            self.used = ids.detach()
        return probs, ids


class MegatronRouting:
    """Every MoE router of this rank's stage, replayable (module doc)."""

    def __init__(self, r: MegatronRank) -> None:
        self.shape = RoutingShape(layers=r.arch.num_layers, top_k=r.arch.moe_top_k, num_experts=r.arch.num_experts)
        self.replays: dict[int, ReplayTopK] = {}
        for layer in r.model.decoder.layers:
            router = layer.mlp.router
            router.router_replay = ReplayTopK()
            self.replays[layer.layer_number - 1] = router.router_replay  # global layer index (pipeline stages)

    def arm(self, r: MegatronRank, routes: Sequence[np.ndarray | None] | None, record: bool,
            batch: int, length: int) -> None:
        """The next forward of a `[batch, length]` micro-batch replays `routes` (rows beyond them,
        padding, route freely) and keeps what it used when `record`."""
        targets = covered = None
        if routes is not None:
            padded = list(routes) + [None] * (batch - len(routes))
            targets_BLXK, covered_BL = targets_for_rows(padded, length, self.shape, r.device)
            targets, covered = self.local_order(r, targets_BLXK), self.local_order(r, covered_BL)
        for layer, replay in self.replays.items():
            replay.target = None if targets is None else targets[:, layer]
            replay.covered, replay.record, replay.used = covered, record, None

    @staticmethod
    def local_order(r: MegatronRank, values_BL: torch.Tensor) -> torch.Tensor:
        """`[B, L, ...]` -> this rank's tokens as its routers see them, `[S_local * B, ...]`."""
        if r.cp_size > 1:
            values_BL = values_BL[:, r.cp_positions(values_BL.shape[1]).to(values_BL.device)]
        values_LB = values_BL.transpose(0, 1)
        if r.config.sequence_parallel and r.tp_size > 1:
            values_LB = values_LB.chunk(r.tp_size, dim=0)[r.tp_rank]
        return values_LB.flatten(0, 1)

    def recorded(self, r: MegatronRank, lengths: Sequence[int], batch: int) -> list[np.ndarray]:
        """Each real row's routing in the last forward, `[len - 1, layers, top_k]` (whole rows only)."""
        if r.cp_size > 1 or (r.config.sequence_parallel and r.tp_size > 1):
            raise NotImplementedError("recording routing under context or sequence parallelism is not built "
                                      "(--use-routing-replay alone; R3 replays the engine's)")
        used = {layer: replay.used for layer, replay in self.replays.items() if replay.used is not None}
        first = next(iter(used.values()))
        ids_LBXK = first.new_zeros((first.shape[0] // batch, batch, self.shape.layers, self.shape.top_k))
        for layer, ids in used.items():
            ids_LBXK[:, :, layer] = ids.view(-1, batch, self.shape.top_k)
        return rows_from_batch(ids_LBXK.transpose(0, 1)[:len(lengths)], lengths, self.shape)
