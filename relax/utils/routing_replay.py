"""Recording and replaying MoE routing in HF transformers models (the `hf` engine records it, the
fsdp trainer replays it), and the row layouts both sides share with the megatron backend.

The routers of the Qwen-MoE family (`Qwen2Moe`, `Qwen3Moe`, `Qwen3VLMoe`, `Qwen3OmniMoe`,
`Qwen3_5Moe`, `Mixtral`, `Olmoe` in transformers 5) share one contract: `router(h_NH) -> (logits_NE,
weights_NK, ids_NK)`, ids the top-k of softmax(logits) and weights those probabilities, renormalised
over the k when the router's `norm_topk_prob` says so (always, for those without the attribute).
`RouterTap` puts a forward hook on every such router. Armed with targets (`arm`), a router's ids
become the recorded ones wherever a token is covered (its own top-k elsewhere) and its weights are
recomputed from its own logits over those ids (`gate_weights`): softmax over the selected experts,
so gradients still reach the router, and bitwise the router's own weights when the ids agree.
Armed with `record`, it keeps the ids each router used (`take`). The state stays armed until armed
again, so a recomputed forward (activation checkpointing) in backward routes as the forward did.

Token order: an HF router sees the hidden states of a `[B, S]` batch flattened batch-major, so
targets and records are `[B * S, layers, top_k]` (`layers` the config's num_hidden_layers; a dense
layer's entries are unused). `targets_for_rows` lays rows' records out over a right-padded batch;
`rows_from_batch` cuts a batch's routing back into rows.
"""

from __future__ import annotations

import re
from typing import Any, Sequence

import numpy as np
import torch

from relax.utils.routing import RoutingShape

# The routers whose output is (logits, weights, ids) with softmax top-k gating (module doc).
SOFTMAX_TOPK_ROUTERS = frozenset({
    "Qwen2MoeTopKRouter", "Qwen3MoeTopKRouter", "Qwen3VLMoeTextTopKRouter", "Qwen3OmniMoeThinkerTextTopKRouter",
    "Qwen3OmniMoeTextTopKRouter", "Qwen3_5MoeTopKRouter", "MixtralTopKRouter", "OlmoeTopKRouter"})
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def merged_ids(own_NK: torch.Tensor, target_NK: torch.Tensor, covered_N: torch.Tensor) -> torch.Tensor:
    """The recorded ids where a token is covered, the router's own elsewhere."""
    return torch.where(covered_N[:, None], target_NK.to(own_NK.device, own_NK.dtype), own_NK)


def gate_weights(logits_NE: torch.Tensor, ids_NK: torch.Tensor, normalize: bool) -> torch.Tensor:
    """The gate weights of experts `ids_NK`: softmax over all experts gathered at the ids (the HF
    routers' own computation), renormalised over the k when `normalize`, in the logits' dtype."""
    probs_NK = torch.softmax(logits_NE, dim=-1, dtype=torch.float).gather(1, ids_NK)
    if normalize:
        probs_NK = probs_NK / probs_NK.sum(dim=-1, keepdim=True)
    return probs_NK.to(logits_NE.dtype)


def moe_routers(model: torch.nn.Module) -> list[tuple[int, torch.nn.Module]]:
    """(decoder layer index, router) of every softmax top-k router of an HF model, in layer order."""
    found = []
    for name, module in model.named_modules():
        if type(module).__name__ in SOFTMAX_TOPK_ROUTERS:
            layer = _LAYER.findall(name)
            if not layer:
                raise ValueError(f"router {name!r} is not inside a decoder layer (model.layers.<i>)")
            found.append((int(layer[-1]), module))
    return sorted(found, key=lambda item: item[0])


class RouterTap:
    """Forward hooks on an HF MoE model's routers that replay and record their top-k ids (module doc)."""

    def __init__(self, model: torch.nn.Module, shape: RoutingShape) -> None:
        self.shape = shape
        self.routers = moe_routers(model)
        if not self.routers:
            routers = sorted({type(m).__name__ for m in model.modules() if "Router" in type(m).__name__})
            raise ValueError(f"model type {getattr(model.config, 'model_type', None)!r} has no router whose routing "
                             f"Relax can record or replay (found: {routers or 'none'}; replayable: "
                             f"{sorted(SOFTMAX_TOPK_ROUTERS)})")
        self.targets: torch.Tensor | None = None  # [N, layers, top_k]
        self.covered: torch.Tensor | None = None  # [N]
        self.record = False
        self.recorded: dict[int, torch.Tensor] = {}
        self.handles = [router.register_forward_hook(self._hook(layer, router)) for layer, router in self.routers]

    def _hook(self, layer: int, router: torch.nn.Module) -> Any:
        normalize = bool(getattr(router, "norm_topk_prob", True))

        def hook(_module: torch.nn.Module, _args: Any, out: Any) -> Any:
            if self.targets is None and not self.record:
                return None
            logits_NE, weights_NK, ids_NK = out
            if self.targets is not None:
                ids_NK = merged_ids(ids_NK, self.targets[:, layer], self.covered)
                weights_NK = gate_weights(logits_NE, ids_NK, normalize)
            if self.record:
                self.recorded[layer] = ids_NK.detach()
            return logits_NE, weights_NK, ids_NK
        return hook

    def arm(self, targets: torch.Tensor | None = None, covered: torch.Tensor | None = None,
            record: bool = False) -> None:
        """What the next forwards do: replay `targets` `[N, layers, top_k]` at the `covered` `[N]`
        tokens (None: route freely), and keep the ids used when `record`."""
        if targets is not None and covered is None:
            covered = torch.ones(targets.shape[0], dtype=torch.bool, device=targets.device)
        self.targets, self.covered, self.record = targets, covered, record
        self.recorded = {}

    def take(self) -> torch.Tensor:
        """The ids the last forward routed with, `[N, layers, top_k]` (zeros for dense layers). The
        tap stays armed (a forward recomputed in backward routes the same way)."""
        if not self.recorded:
            raise RuntimeError("RouterTap.take: no forward was recorded (arm(record=True) first)")
        first = next(iter(self.recorded.values()))
        out = first.new_zeros((first.shape[0], self.shape.layers, self.shape.top_k))
        for layer, ids in self.recorded.items():
            out[:, layer] = ids
        return out

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []


def targets_for_rows(routes: Sequence[np.ndarray | None], length: int, shape: RoutingShape,
                     device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Rows' records laid over a right-padded `[B, length]` batch: `targets_BLXK` (X = layers) and
    `covered_BL` (position p of row b is covered when its record reaches p)."""
    targets = torch.zeros((len(routes), length, shape.layers, shape.top_k), dtype=torch.long)
    covered = torch.zeros((len(routes), length), dtype=torch.bool)
    for b, route in enumerate(routes):
        n = 0 if route is None else min(len(route), length)
        if n:
            targets[b, :n] = torch.from_numpy(np.asarray(route[:n], dtype=np.int64))
            covered[b, :n] = True
    return targets.to(device), covered.to(device)


def rows_from_batch(ids_BLXK: torch.Tensor, lengths: Sequence[int], shape: RoutingShape, *,
                    left_padded: bool = False, whole: bool = False) -> list[np.ndarray]:
    """Each row's routing from a batch's `[B, L, layers, top_k]` (rows right- or left-padded to L,
    `lengths` real tokens each): its first `len - 1` positions, the ones a record keeps (the last
    token's routing predicts nothing), or with `whole` all of them (an engine's prefill, whose
    last prompt token predicts the first output token)."""
    host = ids_BLXK.cpu().numpy().astype(shape.dtype)
    width = host.shape[1]
    out = []
    for b, n in enumerate(lengths):
        start = width - n if left_padded else 0
        out.append(np.ascontiguousarray(host[b, start:start + (n if whole else max(n - 1, 0))]))
    return out


class PaddedRouting:
    """A trainer's routing replay over right-padded `[B, L]` batches of an HF model: rows' records
    replayed (`arm`), the routing used kept per row (`recorded`). The tap is built on first use, so
    a dense model's runner never builds one."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.tap: RouterTap | None = None

    def arm(self, routes: Sequence[np.ndarray | None] | None, record: bool, length: int,
            device: torch.device) -> None:
        """The next forwards replay `routes` (None: route freely) and record when `record`."""
        if routes is None and not record:
            if self.tap is not None:
                self.tap.arm()
            return
        if self.tap is None:
            shape = RoutingShape.from_config(self.model.config.to_dict())
            if shape is None:
                raise ValueError(f"routing replay on a dense model ({self.model.config.model_type!r})")
            self.tap = RouterTap(self.model, shape)
        targets = covered = None
        if routes is not None:
            targets_BLXK, covered_BL = targets_for_rows(routes, length, self.tap.shape, device)
            targets, covered = targets_BLXK.flatten(0, 1), covered_BL.flatten()
        self.tap.arm(targets, covered, record)

    def recorded(self, lengths: Sequence[int]) -> list[np.ndarray]:
        """Each row's routing in the last forward, `[len - 1, layers, top_k]`."""
        ids = self.tap.take()
        return rows_from_batch(ids.view(len(lengths), -1, *ids.shape[1:]), lengths, self.tap.shape)
