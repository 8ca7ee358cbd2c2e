"""The `hf` engine's routing record: SGLang's `--enable-return-routed-experts` (R3, docs/moe.md).

With it the decoder keeps, for every row, the top-k expert ids each MoE layer chose for every token
the row ran through the model: its prompt in the prefill (media tokens and, in a multi-turn
request, the earlier turns and observations are prompt tokens too), then one token per decode step
(the token fed that step). A row that finishes after N sampled tokens has P + N - 1 positions
recorded, SGLang's `seqlen - 1`: the last sampled token is never forwarded. The reply carries them
as SGLang does (`meta_info.routed_experts`, from the request's `routed_experts_start_len`;
`relax.utils.routing`).

The routers are tapped (`relax.utils.routing_replay.RouterTap`); each decoder forward arms the tap,
and takes its ids under the step lock (`BatchDecoder.forward`), so another thread's forward (input
log-probs, a true on-policy rescoring) never lands in a row's record. Only transformers'
DynamicCache path runs MoE models (the slot cache serves dense ones), which is the path recorded.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch

from relax.utils.routing import RoutingShape
from relax.utils.routing_replay import RouterTap, rows_from_batch


def engine_tap(model: torch.nn.Module, enabled: bool) -> RouterTap | None:
    """The routers' tap of an engine started with --enable-return-routed-experts (None without);
    ValueError naming the model when it has no MoE routers."""
    if not enabled:
        return None
    shape = RoutingShape.from_config(model.config.to_dict())
    if shape is None:
        raise ValueError(f"--enable-return-routed-experts: model type {model.config.model_type!r} is dense (no "
                         "num_experts / num_experts_per_tok in its config); routed experts exist for MoE models only")
    return RouterTap(model, shape)


def keep_prefill(states: Sequence[Any], rows: Sequence[int], index: Sequence[int],
                 prompt_lengths: Sequence[int], ids: torch.Tensor, shape: RoutingShape) -> None:
    """A prefill's routing into its rows' records: `ids` `[U * L, layers, top_k]` of U left-padded
    distinct prompts (`prompt_lengths`), row j of `rows` taking prompt `index[j]`'s."""
    per_prompt = rows_from_batch(ids.view(len(prompt_lengths), -1, shape.layers, shape.top_k), prompt_lengths,
                                 shape, left_padded=True, whole=True)
    for j, i in enumerate(rows):
        states[i].routing.append(per_prompt[index[j]])


def keep_decode(states: Sequence[Any], rows: Sequence[int], ids: torch.Tensor, shape: RoutingShape) -> None:
    """A decode step's routing (`[B, layers, top_k]`, one token per running row) into the rows' records."""
    host = ids.cpu().numpy().astype(shape.dtype)
    for b, i in enumerate(rows):
        states[i].routing.append(host[b:b + 1])


def record_of(chunks: list[np.ndarray]) -> np.ndarray | None:
    """A row's record from its chunks (None when nothing ran through the model)."""
    return np.concatenate(chunks, axis=0) if chunks else None
