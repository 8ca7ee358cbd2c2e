"""The `hf` engine's decode path for Llama-family models (and the dense VL models' language
models): a KV cache written in place, CUDA graphs.

Why: transformers' `DynamicCache` concatenates every layer's keys and values each step (the
whole cache copied per token) and a decode step launches ~1,600 small kernels from Python, so
decoding is bound by launches, not by the GPU (docs/backends/hf.md, "Decode path").

Layout. One pair of buffers per layer, `keys/values[S, H_kv, L, D]`: S slots (one per running
row) of L columns. A row owns a slot while it runs. Its prompt's keys and values are copied in
from the (left-padded) prefill forward as they are, so a row's cached columns are
`[start, write)`: `start` = the left padding of its prefill group, `write` = the column its next
token is written to; its position id is `write - start`. A decode step writes each row's new
key/value at its `write` column (in place: `index_put_`) and attends over columns
`[start, write]` of its own slot. Slots are independent: a group that joins a running batch just
takes free slots, nothing is merged or trimmed. A finished row frees its slot.

The decode forward (`decode_forward`) is this module's own, built from the model's modules
(embeddings, each layer's norms, projections, q/k norms where the model has them, rotary
embedding, MLP, final norm, LM head): the same weights and kernels as the transformers forward,
only the attention reads the slot layout. Attention for one query token per row is two batched
matmuls with a float32 softmax; grouped-query heads are not repeated.

Vision-language models (Qwen2.5-VL, Qwen3-VL): their prompts are prefilled by the full model
(encoders, M-RoPE) and copied into slots like any prefill; a decode step feeds one text token,
whose three M-RoPE components are equal, and with equal components M-RoPE (sectioned or
interleaved) is plain RoPE at that position. So the step runs the language model alone
(`text_body`) with plain rotary embeddings; a row's position is `write - start + offset`, the
offset (`StepInputs.offset`, <= 0) saying how much shorter its prompt's positions ran than its
tokens (an image's tokens share grid positions).

CUDA graphs (`GraphRunner`): on a GPU each decode step runs over the first `B` slots and the
first `T` columns, `B` and `T` rounded up to captured sizes (`batch_sizes()`, multiples of
`COLUMN_BLOCK`); the step is captured once per (B, T) and replayed, with the inputs in static
buffers. Slots past the last running row (and free slots among them) compute on dummy inputs
(column 0 of a free slot) and are ignored. Graphs hold the buffers' and parameters' addresses:
weight loads copy in place (graphs stay valid); releasing memory or growing the cache drops them.

Capacity: the cache holds `rows x columns` token slots; columns grow (doubling, rows copied) to
fit the longest request admitted, within `max_total_tokens` (SGLang's `--max-total-tokens`), or,
unset, within what the device has free (`FREE_MEMORY_SHARE` of it) when the cache is sized. A
request that does not fit waits until running rows finish.
"""

from __future__ import annotations

import logging
import math
import sys
from dataclasses import dataclass
from typing import Any, Callable

import torch

logger = logging.getLogger(__name__)

SUPPORTED_MODEL_TYPES = frozenset({"llama", "qwen2", "qwen3"})
VL_MODEL_TYPES = frozenset({"qwen2_5_vl", "qwen3_vl"})  # dense language models, M-RoPE (module doc)
COLUMN_BLOCK = 64  # captured column counts are multiples of this (attention reads up to the multiple)
FREE_MEMORY_SHARE = 0.8  # of the device's free memory, what the cache may take when no budget is set


def text_config(model: torch.nn.Module) -> Any:
    """The language model's config (a VL model's `text_config`)."""
    return getattr(model.config, "text_config", None) or model.config


def text_body(model: torch.nn.Module) -> Any:
    """The module holding embed_tokens / layers / norm / rotary_emb: `model.model`, or a VL
    model's `model.model.language_model`."""
    body = getattr(model, "model", None)
    return getattr(body, "language_model", None) or body


def is_vl(model: torch.nn.Module) -> bool:
    return getattr(model.config, "model_type", None) in VL_MODEL_TYPES


def static_decode_supported(model: torch.nn.Module) -> str | None:
    """None when `decode_forward` can run this model; else why not (the engine falls back to
    transformers' DynamicCache path)."""
    model_type = getattr(model.config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES | VL_MODEL_TYPES:
        return f"model type {model_type!r} (supported: {sorted(SUPPORTED_MODEL_TYPES | VL_MODEL_TYPES)})"
    config = text_config(model)
    if getattr(config, "use_sliding_window", False) or any(
            t != "full_attention" for t in (getattr(config, "layer_types", None) or [])):
        return "sliding-window attention layers"
    body = text_body(model)
    needed = ("embed_tokens", "layers", "norm", "rotary_emb")
    if body is None or any(not hasattr(body, name) for name in needed) or not hasattr(model, "lm_head"):
        return "the model does not have the Llama module layout (model.embed_tokens/layers/norm/rotary_emb, lm_head)"
    for layer in body.layers:
        attn = getattr(layer, "self_attn", None)
        if attn is None or any(not hasattr(attn, n) for n in ("q_proj", "k_proj", "v_proj", "o_proj")) or any(
                not hasattr(layer, n) for n in ("input_layernorm", "post_attention_layernorm", "mlp")):
            return "a decoder layer without the Llama attention/MLP layout"
    return None


def _rotary(model: torch.nn.Module) -> Callable:
    """The model's own `apply_rotary_pos_emb` (its modeling module's); plain rotate-half RoPE for
    a VL model (equal M-RoPE components: module doc)."""
    if is_vl(model):
        return _plain_rotary
    module = sys.modules[type(text_body(model).layers[0].self_attn).__module__]
    return module.apply_rotary_pos_emb


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def _plain_rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE on q, k `[B, heads, S, D]` with cos, sin `[B, S, D]` (Llama's apply_rotary_pos_emb)."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


def _cos_sin(body: Any, hidden: torch.Tensor, position_B1: torch.Tensor, vl: bool
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """The rotary embedding's cos, sin `[B, 1, D]` at the positions (a VL model's M-RoPE with its
    three components equal; Qwen2.5-VL's returns them per component: all the same)."""
    if not vl:
        return body.rotary_emb(hidden, position_B1)
    cos, sin = body.rotary_emb(hidden, position_B1[None].expand(3, -1, -1))
    return (cos[0], sin[0]) if cos.dim() == 4 else (cos, sin)


@dataclass
class KVShape:
    layers: int
    kv_heads: int
    head_dim: int
    dtype: torch.dtype

    @property
    def bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype.itemsize


def kv_shape(model: torch.nn.Module) -> KVShape:
    config = text_config(model)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return KVShape(config.num_hidden_layers, config.num_key_value_heads, head_dim, next(model.parameters()).dtype)


def round_columns(columns: int) -> int:
    return max(COLUMN_BLOCK, math.ceil(columns / COLUMN_BLOCK) * COLUMN_BLOCK)


def batch_sizes(max_rows: int) -> list[int]:
    """Captured batch sizes: 1, 2, 4, 8, then every 8 up to 64, every 16 up to 256, every 32 after."""
    sizes = [1, 2, 4] + list(range(8, 65, 8)) + list(range(80, 257, 16)) + list(range(288, max(max_rows, 288) + 32, 32))
    out = [s for s in sizes if s < max_rows] + [max_rows]
    return sorted(set(out))


class SlotCache:
    """The per-layer key/value buffers and which slots are free."""

    def __init__(self, shape: KVShape, device: torch.device, *, max_rows: int, max_total_tokens: int | None):
        self.shape, self.device = shape, device
        self.max_rows, self.max_total_tokens = max_rows, max_total_tokens
        self.rows = self.columns = 0
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.free: list[int] = []
        self.version = 0  # bumped whenever the buffers move (graphs captured against them are stale)

    @property
    def allocated(self) -> bool:
        return bool(self.keys)

    def token_budget(self) -> int | None:
        """Token slots the cache may hold (None: no limit, on CPU without --max-total-tokens)."""
        if self.max_total_tokens is not None:
            return self.max_total_tokens
        if self.device.type != "cuda":
            return None
        free, _ = torch.cuda.mem_get_info(self.device)
        held = self.rows * self.columns
        return held + int(free * FREE_MEMORY_SHARE) // self.shape.bytes_per_token

    def reserve(self, rows: int, columns: int) -> int:
        """Make room for up to `rows` more rows of up to `columns` columns (growing the buffers
        within the budget); returns how many of them can take a slot now (0: wait for running
        rows to finish)."""
        cols = max(self.columns, round_columns(columns))
        used = self.rows - len(self.free)
        budget = self.token_budget()
        if used == 0 and self.allocated and budget is not None and self.rows * cols > budget:
            self.release()  # idle: start over at the size this batch needs
            budget = self.token_budget()
        limit = self.max_rows if budget is None else min(self.max_rows, budget // cols)
        if limit <= used or (budget is not None and self.rows * cols > budget):
            return 0
        # Rows grow at least twofold, to a captured batch size: rows that trickle in (a fully async
        # rollout joins a few per step) must not copy the cache and recapture graphs each time.
        target = min(limit, max(self.rows, self._ladder(max(used + rows, 2 * self.rows))))
        if cols > self.columns or target > self.rows:
            self._grow(target, cols)
        return min(rows, len(self.free))

    def _grow(self, rows: int, columns: int) -> None:
        rows = max(rows, self.rows)
        columns = max(columns, self.columns)
        shape = (rows, self.shape.kv_heads, columns, self.shape.head_dim)
        new_k = [torch.zeros(shape, dtype=self.shape.dtype, device=self.device) for _ in range(self.shape.layers)]
        new_v = [torch.zeros(shape, dtype=self.shape.dtype, device=self.device) for _ in range(self.shape.layers)]
        for old, new in ((self.keys, new_k), (self.values, new_v)):
            for o, n in zip(old, new):
                n[:o.shape[0], :, :o.shape[2]].copy_(o)
        self.free += list(range(self.rows, rows))
        self.free.sort()
        self.keys, self.values, self.rows, self.columns = new_k, new_v, rows, columns
        self.version += 1
        logger.info("KV cache: %d rows x %d columns (%.2f GiB)", rows, columns,
                    rows * columns * self.shape.bytes_per_token / 2**30)

    def _ladder(self, rows: int) -> int:
        """The smallest captured batch size >= rows (at most max_rows)."""
        return next((size for size in batch_sizes(self.max_rows) if size >= rows), self.max_rows)

    def take(self, count: int) -> list[int]:
        taken, self.free = self.free[:count], self.free[count:]
        return taken

    def give_back(self, slots: list[int]) -> None:
        self.free = sorted(self.free + list(slots))

    def release(self) -> None:
        """Free the buffers (memory release); the next batch allocates them again."""
        self.keys, self.values, self.free = [], [], []
        self.rows = self.columns = 0
        self.version += 1


def write_prefill(cache: SlotCache, prefill_layers: list[tuple[torch.Tensor, torch.Tensor]], slots_B: torch.Tensor,
                  source_B: torch.Tensor) -> None:
    """Copy each row's prefill keys/values ([U, H, Lp, D] per layer, left-padded) into its slot's
    first Lp columns; row b takes prefill row source_B[b]."""
    for layer, (k, v) in enumerate(prefill_layers):
        width = k.shape[2]
        cache.keys[layer][slots_B, :, :width] = k.index_select(0, source_B)
        cache.values[layer][slots_B, :, :width] = v.index_select(0, source_B)


class StepInputs:
    """The decode step's inputs for slots [0, rows): token, write column, first column, and the
    position offset (a VL row's: module doc; 0 for text rows)."""

    def __init__(self, rows: int, device: torch.device):
        self.ids = torch.zeros(rows, dtype=torch.long, device=device)
        self.write = torch.zeros(rows, dtype=torch.long, device=device)
        self.start = torch.zeros(rows, dtype=torch.long, device=device)
        self.offset = torch.zeros(rows, dtype=torch.long, device=device)

    def set(self, rows: int, slots_B: torch.Tensor, ids_B: torch.Tensor, write_B: torch.Tensor,
            start_B: torch.Tensor, offset_B: torch.Tensor | None = None) -> None:
        """Dummy inputs (token 0 at column 0) on every slot < rows, then the running rows'."""
        for buf in (self.ids, self.write, self.start, self.offset):
            buf[:rows].zero_()
        self.ids.index_copy_(0, slots_B, ids_B)
        self.write.index_copy_(0, slots_B, write_B)
        self.start.index_copy_(0, slots_B, start_B)
        if offset_B is not None:
            self.offset.index_copy_(0, slots_B, offset_B)


def decode_forward(model: torch.nn.Module, cache: SlotCache, inputs: StepInputs, rows: int, columns: int,
                   rotary: Callable) -> torch.Tensor:
    """One token for each of slots [0, rows) over their first `columns` columns: writes the new
    keys/values in place, returns logits [rows, V]."""
    body = text_body(model)
    ids, write, start = inputs.ids[:rows], inputs.write[:rows], inputs.start[:rows]
    position_B1 = (write - start + inputs.offset[:rows])[:, None]
    hidden = body.embed_tokens(ids[:, None])  # [B, 1, H]
    cos, sin = _cos_sin(body, hidden, position_B1, rotary is _plain_rotary)
    col_T = torch.arange(columns, device=ids.device)
    visible_BT = (col_T[None] >= start[:, None]) & (col_T[None] <= write[:, None])
    bias_B11T = torch.zeros(visible_BT.shape, dtype=torch.float32, device=ids.device).masked_fill_(
        ~visible_BT, float("-inf"))[:, None, None]
    row_B = torch.arange(rows, device=ids.device)
    for index, layer in enumerate(body.layers):
        attn = layer.self_attn
        x = layer.input_layernorm(hidden)
        head_dim = cache.shape.head_dim
        q = attn.q_proj(x).view(rows, 1, -1, head_dim)
        k = attn.k_proj(x).view(rows, 1, -1, head_dim)
        v = attn.v_proj(x).view(rows, 1, -1, head_dim)
        if hasattr(attn, "q_norm"):
            q, k = attn.q_norm(q), attn.k_norm(k)
        q, k = rotary(q.transpose(1, 2), k.transpose(1, 2), cos, sin)  # [B, heads, 1, D]
        keys, values = cache.keys[index], cache.values[index]
        keys[row_B, :, write] = k[:, :, 0]
        values[row_B, :, write] = v[:, 0]
        kv_heads = keys.shape[1]
        q = q.reshape(rows, kv_heads, -1, head_dim)  # [B, H_kv, group, D]
        scores = torch.matmul(q, keys[:rows, :, :columns].transpose(-1, -2)).float() * attn.scaling
        probs = torch.softmax(scores + bias_B11T, dim=-1).to(q.dtype)
        out = torch.matmul(probs, values[:rows, :, :columns]).reshape(rows, 1, -1)
        hidden = hidden + attn.o_proj(out)
        hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
    return model.lm_head(body.norm(hidden))[:, 0]


class GraphRunner:
    """Runs `decode_forward` for (rows, columns), captured as a CUDA graph per pair on a GPU
    (eager on CPU, or with `use_graphs=False`)."""

    def __init__(self, model: torch.nn.Module, cache: SlotCache, *, max_rows: int, use_graphs: bool,
                 graph_max_rows: int | None = None):
        """`graph_max_rows` (SGLang's --cuda-graph-max-bs): steps over more slots run eagerly."""
        self.model, self.cache = model, cache
        self.rotary = _rotary(model)
        self.use_graphs = use_graphs and cache.device.type == "cuda"
        self.graph_max_rows = graph_max_rows or max_rows
        self.sizes = batch_sizes(max_rows)
        self.inputs: StepInputs | None = None
        self.graphs: dict[tuple[int, int], tuple[Any, torch.Tensor]] = {}
        self._pool = None
        self._stream = None  # one capture stream: each new stream would hold its own cuBLAS workspace
        self._cache_version = -1

    def reset(self) -> None:
        """Drop every captured graph (parameters or cache buffers moved)."""
        self.graphs.clear()
        self._pool = None
        self.inputs = None

    def shape_for(self, max_slot: int, max_write: int) -> tuple[int, int]:
        """The (rows, columns) a step runs over: exact on CPU, rounded to captured sizes on GPU."""
        if not self.use_graphs:
            return max_slot + 1, max_write + 1
        rows = next((s for s in self.sizes if s > max_slot), self.cache.rows)
        return min(rows, self.cache.rows), min(round_columns(max_write + 1), self.cache.columns)

    def step(self, slots_B: torch.Tensor, ids_B: torch.Tensor, write_B: torch.Tensor, start_B: torch.Tensor,
             max_slot: int, max_write: int, offset_B: torch.Tensor | None = None) -> torch.Tensor:
        """Logits [B, V] for the running rows (in slots_B order)."""
        if self._cache_version != self.cache.version:
            self.reset()
            self._cache_version = self.cache.version
        if self.inputs is None:
            self.inputs = StepInputs(self.cache.rows, self.cache.device)
        rows, columns = self.shape_for(max_slot, max_write)
        self.inputs.set(rows, slots_B, ids_B, write_B, start_B, offset_B)
        if not self.use_graphs or rows > self.graph_max_rows:
            logits = decode_forward(self.model, self.cache, self.inputs, rows, columns, self.rotary)
        else:
            logits = self._replay(rows, columns)
        return logits.index_select(0, slots_B)

    def _replay(self, rows: int, columns: int) -> torch.Tensor:
        key = (rows, columns)
        if key not in self.graphs:
            self.graphs[key] = self._capture(rows, columns)
        graph, logits = self.graphs[key]
        graph.replay()
        return logits

    def _capture(self, rows: int, columns: int) -> tuple[Any, torch.Tensor]:
        # Warm up on a side stream (the same inputs write the same keys/values: idempotent).
        if self._stream is None:
            self._stream = torch.cuda.Stream(self.cache.device)
        stream = self._stream
        stream.wait_stream(torch.cuda.current_stream(self.cache.device))
        with torch.cuda.stream(stream):
            decode_forward(self.model, self.cache, self.inputs, rows, columns, self.rotary)
        torch.cuda.current_stream(self.cache.device).wait_stream(stream)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            logits = decode_forward(self.model, self.cache, self.inputs, rows, columns, self.rotary)
        return graph, logits
