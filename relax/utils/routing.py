"""MoE routing records for routing replay (R3): which experts each token went to, per layer.

An MoE engine started with `--enable-return-routed-experts` and asked with `return_routed_experts`
reports, per request, the top-k expert ids it chose for every token it ran through the model
(SGLang >= 0.5.7, the `hf` engine): `meta_info["routed_experts"]`, base64 of a little-endian
int32 C-order array `[n, num_hidden_layers, top_k]` for sequence positions `[start, start + n)`,
where `start` is the request's `routed_experts_start_len` (SGLang >= 0.5.8, default 0) and
`start + n` = prompt + output tokens - 1 (the last sampled token is never forwarded). The prompt
positions come from the engine's prefill: media tokens, and in a multi-turn rollout the
observation tokens of every turn, are prefilled like any other prompt token.

A sample keeps its record as one compact array `[positions, layers, top_k]` for positions
`[0, positions)` of `sample.tokens` (`extend` appends what a later request reports: a resumed
partial sample or the next turn keep what they had); an id takes one byte for models with at most
256 experts, two (int16) otherwise (`RoutingShape.dtype`). On the data plane a row's record is
that array's bytes (`to_bytes` / `from_bytes`): the trainer knows the shape from its own model.
Positions a record does not cover (a trailing observation no request prefilled) are routed by
the trainer's own router. Pure numpy: no torch, used by the rollout, the engine and the trainers.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

import numpy as np

UINT8_EXPERTS = 256  # ids of models with at most this many experts fit one byte
REPLY_DTYPE = np.dtype("<i4")  # SGLang's wire format (int32, little-endian)


@dataclass(frozen=True)
class RoutingShape:
    """What a routing record of one model looks like: `layers` (the config's num_hidden_layers,
    SGLang's layer axis; a dense layer's entries are unused), `top_k` experts per token, out of
    `num_experts`."""

    layers: int
    top_k: int
    num_experts: int

    @property
    def dtype(self) -> np.dtype:
        """The compact dtype of one expert id."""
        return np.dtype(np.uint8) if self.num_experts <= UINT8_EXPERTS else np.dtype("<i2")

    @property
    def width(self) -> int:
        """Expert ids per token."""
        return self.layers * self.top_k

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> RoutingShape | None:
        """From a config.json dict (a VL / Omni model's language model); None for a dense model."""
        text = text_config(config)
        experts = next((text[k] for k in ("num_experts", "num_local_experts", "n_routed_experts") if text.get(k)), 0)
        top_k = text.get("num_experts_per_tok") or 0
        if not experts or not top_k:
            return None
        return cls(layers=int(text["num_hidden_layers"]), top_k=int(top_k), num_experts=int(experts))

    def empty(self) -> np.ndarray:
        return np.zeros((0, self.layers, self.top_k), dtype=self.dtype)


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The language model's part of a config.json: a VL model's `text_config`, an Omni model's
    `thinker_config.text_config`, else the config itself."""
    outer = config.get("thinker_config", config)
    return outer.get("text_config", outer)


def decode_reply(value: str, shape: RoutingShape) -> np.ndarray:
    """`meta_info["routed_experts"]` -> `[n, layers, top_k]` in the compact dtype. ValueError when
    the bytes do not hold whole tokens of this shape or an id is out of range."""
    raw = np.frombuffer(base64.b64decode(value), dtype=REPLY_DTYPE)
    if raw.size % shape.width:
        raise ValueError(f"meta_info.routed_experts holds {raw.size} expert ids, not a whole number of tokens of "
                         f"{shape.layers} layers x top-{shape.top_k}; the engine serves another model than "
                         "--hf-checkpoint describes")
    if raw.size and (int(raw.min()) < 0 or int(raw.max()) >= shape.num_experts):
        raise ValueError(f"meta_info.routed_experts has expert ids outside [0, {shape.num_experts}): "
                         f"min {int(raw.min())}, max {int(raw.max())}")
    return raw.reshape(-1, shape.layers, shape.top_k).astype(shape.dtype)


def encode_reply(ids: np.ndarray) -> str:
    """`[n, layers, top_k]` expert ids as SGLang sends them (base64 of little-endian int32)."""
    return base64.b64encode(np.ascontiguousarray(ids, dtype=REPLY_DTYPE).tobytes()).decode("ascii")


def extend(recorded: np.ndarray | None, reply: np.ndarray, start: int) -> np.ndarray:
    """A sample's record after a request that reported positions `[start, start + len(reply))`:
    what it had before `start`, then the reply. ValueError when the request started past what the
    sample had recorded (a gap no request covered)."""
    kept = 0 if recorded is None else len(recorded)
    if start > kept:
        raise ValueError(f"routed experts reported from position {start}, but the sample's record ends at {kept}: "
                         "send routed_experts_start_len = the positions recorded so far")
    if recorded is None or start == 0:
        return np.ascontiguousarray(reply)
    return np.concatenate([recorded[:start], reply.astype(recorded.dtype)], axis=0)


def positions(recorded: np.ndarray | None) -> int:
    """Sequence positions a record covers (from position 0)."""
    return 0 if recorded is None else len(recorded)


def to_bytes(recorded: np.ndarray | None, shape: RoutingShape) -> bytes:
    """A row's record on the data plane (b"" for none)."""
    if recorded is None or not len(recorded):
        return b""
    if recorded.shape[1:] != (shape.layers, shape.top_k):
        raise ValueError(f"a routing record of shape {recorded.shape} for a model of {shape.layers} layers x "
                         f"top-{shape.top_k}")
    return np.ascontiguousarray(recorded, dtype=shape.dtype).tobytes()


def from_bytes(data: Any, shape: RoutingShape) -> np.ndarray:
    """Inverse of `to_bytes` (bytes, or TransferQueue's uint8 tensor): `[positions, layers, top_k]`."""
    if data is None:
        return shape.empty()
    if hasattr(data, "numpy"):
        data = data.numpy().tobytes()
    flat = np.frombuffer(bytes(data), dtype=shape.dtype)
    if flat.size % shape.width:
        raise ValueError(f"a routing record of {flat.size} ids is not a whole number of tokens of {shape.layers} "
                         f"layers x top-{shape.top_k}: the rollout and the trainer read different models")
    return flat.reshape(-1, shape.layers, shape.top_k)
