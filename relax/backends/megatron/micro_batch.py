"""One megatron micro-batch: its inputs, the head its forward returns through, and the one-stage
forward.

--qkv-format thd (`_packed`, where the rank packs: `packing.py`): the rows concatenated into one
token stream, padded to the token count every rank of the expert group runs. bshd (`_padded`):
rows right-padded under a causal mask (no real token attends to a pad), padded further to the
shape every rank of the expert group runs (the all-gather token dispatcher exchanges equal-sized
blocks) and to a pipeline schedule's one activation shape, with lengths a multiple of the
tensor-parallel size under --sequence-parallel and of 2C under context parallelism (each rank then
holds two of 2C chunks of every row, or one of C with --allgather-cp, `attention.py`). The head
replaces the output layer for the forward: response log-probs and entropies
(`head.MegatronResponseHead`, vocabulary-parallel) or a critic's values (`head.MegatronValueHead`),
each read at its token's place in the flattened hidden states. A VL model's micro-batch carries
its rows' encoder tensors and M-RoPE positions (`vision.py`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from relax.backends.base import Rows, Scores
from relax.backends.batching import pad_inputs, response_positions
from relax.backends.megatron.attention import cp_causal_mask
from relax.backends.megatron.head import MegatronResponseHead, MegatronValueHead
from relax.backends.megatron.packing import PackedRoPE, pack
from relax.utils.multimodal.tensors import collate, from_bytes

if TYPE_CHECKING:
    from relax.backends.megatron.rank import MegatronRank


class MicroBatch:
    """One micro-batch's inputs, and the head swapped in on the last stage while it runs."""

    def __init__(self, ids_BL, position_BL, attention_mask, mask_BT, rows, head, entropy, bf16) -> None:
        # attention_mask: the causal `[1, 1, L, L]` (True = masked; under CP over the gathered keys), or
        # packed rows' `PackedRows` (ids_BL is then their [1, N] stream)
        self.ids_BL, self.position_BL, self.attention_mask, self.mask_BT = ids_BL, position_BL, attention_mask, mask_BT
        self.rows, self.head, self.entropy = rows, head, entropy
        self.embed: Any = None  # model -> the decoder's input (a VL micro-batch with media)
        self.take_routing: Any = None  # () -> each row's routing in this forward (a recording one, routing.py)
        self.rope: Any = None  # --qkv-format thd: the packed rows' RoPE positions (`packing.PackedRoPE`)
        self.autocast = torch.autocast(ids_BL.device.type, dtype=torch.bfloat16, enabled=bf16)

    def __enter__(self) -> "MicroBatch":
        for swap in (self.head, self.rope):
            if swap is not None:
                swap.__enter__()
        self.autocast.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.autocast.__exit__(*exc)
        for swap in (self.rope, self.head):
            if swap is not None:
                swap.__exit__(*exc)

    def call(self, model: torch.nn.Module) -> torch.Tensor:
        if self.embed is not None:
            return model(self.ids_BL, self.position_BL, self.attention_mask, decoder_input=self.embed(model))
        if hasattr(model, "deepstack_adds"):  # a VL model's micro-batch without media: no deepstack additions
            model.deepstack_adds = None
        return model(self.ids_BL, self.position_BL, self.attention_mask)

    def outputs(self, out_BTK: torch.Tensor) -> Scores:
        """The real rows' log-probs (or values), mask and entropies."""
        out_BTK, mask_BT = out_BTK[:self.rows], self.mask_BT[:self.rows]
        if isinstance(self.head, MegatronValueHead):
            return Scores(out_BTK[..., 0].float() * mask_BT, mask_BT)
        return Scores(out_BTK[..., 0].float(), mask_BT, out_BTK[..., 1].float() if self.entropy else None,
                      routing=self.take_routing() if self.take_routing is not None else None)


def forward(r: MegatronRank, rows: Rows, entropy: bool = False, entropy_grad: bool = False) -> Scores:
    """One stage's forward of `rows` at the rollout temperature (pipeline parallelism goes through
    `pipeline.run`)."""
    if rows.media and any(rows.media) and r.vision is None:
        raise ValueError(f"rows with media, but {r.spec.model_path} is a text model")
    if r.spec.true_on_policy:
        raise NotImplementedError("--true-on-policy-mode runs on the fsdp backend")
    with build(r, rows, entropy=entropy, entropy_grad=entropy_grad) as run:
        return run.outputs(run.call(r.model))


def build(r: MegatronRank, rows: Rows, *, entropy: bool, entropy_grad: bool) -> MicroBatch:
    """A micro-batch's inputs and the head its forward returns through: response log-probs (and
    entropies), or a value head's values (`[B, T, 1]`)."""
    index_BT, mask_BT = response_positions([len(t) for t in rows.tokens], rows.response_lengths)
    if r.packed:  # --qkv-format thd
        return _packed(r, rows.tokens, index_BT, mask_BT, entropy=entropy, entropy_grad=entropy_grad)
    return _padded(r, rows, index_BT, mask_BT, entropy=entropy, entropy_grad=entropy_grad)


def _packed(r: MegatronRank, tokens: list[list[int]], index_BT: torch.Tensor, mask_BT: torch.Tensor, *,
            entropy: bool, entropy_grad: bool) -> MicroBatch:
    """thd: the rows as one `[1, N]` stream (`packing.pack`); row b's token t is read at its row's
    start plus `index_BT[b, t]` and predicts the token after it."""
    lengths = [len(t) for t in tokens]
    real, total = sum(lengths), common_tokens(r, sum(lengths))
    packed = pack(lengths, total, r.device)
    ids_N = torch.tensor([i for t in tokens for i in t] + [r.pad_id] * (total - real), device=r.device)
    last_B1 = torch.tensor(lengths, device=r.device)[:, None] - 2  # a row's last position that predicts a token
    index_BT = torch.minimum(index_BT.to(r.device), last_B1).clamp(min=0)  # padded slots: the mask zeroes them
    flat_BT = packed.starts_S[:len(tokens), None] + index_BT
    targets_BT = ids_N[(flat_BT + 1).clamp(max=total - 1)]
    mask_BT = mask_BT.to(r.device)
    head = _head(r, flat_BT, mask_BT, targets_BT, entropy=entropy, entropy_grad=entropy_grad)
    autocast = r.spec.optim.bf16 and not r.main
    run = MicroBatch(ids_N[None], packed.positions_N[None], packed, mask_BT, len(tokens), head, entropy, autocast)
    run.rope = PackedRoPE(r.model.rotary_pos_emb, packed)
    return run


def _padded(r: MegatronRank, rows: Rows, index_BT: torch.Tensor, mask_BT: torch.Tensor, *, entropy: bool,
            entropy_grad: bool) -> MicroBatch:
    """bshd: rows right-padded to a common `[B, L]` (see the module doc)."""
    tokens = rows.tokens
    ids_BL, _ = pad_inputs(tokens, r.pad_id)
    ids_BL, index_BT, mask_BT = common_shape(r, ids_BL, index_BT, mask_BT)
    ids_BL = ids_BL.to(r.device)
    b, length = ids_BL.shape
    index_BT = index_BT.clamp(max=length - 2).to(r.device)  # padded slots: the mask zeroes them
    mask_BT = mask_BT.to(r.device)
    targets_BT = ids_BL[:, 1:].gather(1, index_BT)
    position_BL = torch.arange(length, device=r.device)[None].expand(b, -1)
    # Right padding under a causal mask (megatron's default causal mask is built on "cuda", so it is passed).
    causal_11LL = torch.triu(torch.ones(length, length, dtype=torch.bool, device=r.device), 1)[None, None]
    head_index_BT, head_mask_BT = index_BT, mask_BT
    if r.cp_size > 1:  # this rank's chunks of every row (attention.py: cp_positions)
        ids_BL, position_BL, causal_11LL, head_index_BT, head_mask_BT = cp_shard(r, ids_BL, index_BT, mask_BT)
    flat_BT = torch.arange(b, device=r.device)[:, None] * ids_BL.shape[1] + head_index_BT  # [B, S] flattened
    head = _head(r, flat_BT, head_mask_BT, targets_BT, entropy=entropy, entropy_grad=entropy_grad)
    autocast = r.spec.optim.bf16 and not r.main  # a scoring rank's float32 weights under --bf16
    run = MicroBatch(ids_BL, position_BL, causal_11LL, mask_BT, len(tokens), head, entropy, autocast)
    if r.routing is not None:  # routing replay (MoE): every forward arms (or disarms) the routers
        r.routing.arm(r, rows.routing, rows.record_routing, b, length)
        if rows.record_routing:
            run.take_routing = lambda: r.routing.recorded(r, [len(t) for t in tokens], b)
    if r.vision is not None:
        _with_media(r, run, tokens, rows.media, position_BL)
    return run


def _head(r: MegatronRank, flat_BT: torch.Tensor, mask_BT: torch.Tensor, targets_BT: torch.Tensor, *,
          entropy: bool, entropy_grad: bool) -> Any:
    cp_group = r.ps.get_context_parallel_group() if r.cp_size > 1 else None
    tp_group = r.ps.get_tensor_model_parallel_group()
    if r.spec.head == "value":
        return MegatronValueHead(r.model.output_layer, r.model.value_head, flat_BT, mask_BT, tp_group=tp_group,
                                 sequence_parallel=r.config.sequence_parallel, cp_group=cp_group)
    if not r.last_stage:
        return None
    return MegatronResponseHead(
        r.model.output_layer, flat_BT, mask_BT, targets_BT, temperature=r.spec.temperature,
        chunk=r.spec.batch.log_probs_chunk_size, entropy=entropy, entropy_grad=entropy_grad, tp_group=tp_group,
        tp_rank=r.tp_rank, tp_size=r.tp_size, sequence_parallel=r.config.sequence_parallel, cp_group=cp_group,
        vocab_size=r.arch.vocab_size, recompute=r.spec.model_parallel.recompute_loss_function,
        fused=r.spec.compile_layers and r.device.type == "cuda")  # --use-torch-compile, as fsdp


def _with_media(r: MegatronRank, run: MicroBatch, tokens: list[list[int]], media: list[bytes] | None,
                position_BL: torch.Tensor) -> None:
    """M-RoPE positions [3, B, L] (rows given without media: text positions) and, with media, the
    encoders' features in place of their placeholder tokens."""
    run.position_BL = position_BL[None].expand(3, -1, -1)
    if media is None:
        return
    ids_BL = run.ids_BL
    real_BL = torch.zeros_like(ids_BL, dtype=torch.bool)
    for i, t in enumerate(tokens):
        real_BL[i, :len(t)] = True
    tensors = {k: v.to(r.device) for k, v in collate([from_bytes(m) for m in media]).items()}
    run.position_BL = r.vision.positions(ids_BL, real_BL, tensors)
    if tensors:
        run.embed = lambda model: r.vision.embed(model, ids_BL, tensors, r.config.sequence_parallel)


def cp_shard(r: MegatronRank, ids_BL: torch.Tensor, index_BT: torch.Tensor, mask_BT: torch.Tensor):
    """Context parallelism: this rank's share of a micro-batch padded to a multiple of 2C.
    Returns its tokens `ids_BS` and their global positions `position_BS` (S = L / C; RoPE is
    cut to them by megatron-core itself), the attention mask over the all-gathered keys
    `[1, 1, S, L]`, and where the response tokens it holds are read (`index_BT` local,
    `mask_BT` of those it holds)."""
    b, length = ids_BL.shape
    positions_S = r.cp_positions(length).to(r.device)
    local_L = torch.full((length,), -1, dtype=torch.long, device=r.device)
    local_L[positions_S] = torch.arange(len(positions_S), device=r.device)
    local_BT = local_L[index_BT]
    mask_11SL = cp_causal_mask(length, r.cp_size, r.cp_rank, r.spec.model_parallel.allgather_cp).to(r.device)
    return (ids_BL[:, positions_S], positions_S[None].expand(b, -1), mask_11SL, local_BT.clamp(min=0),
            mask_BT * (local_BT >= 0))


def common_shape(r: MegatronRank, ids_BL: torch.Tensor, index_BT: torch.Tensor, mask_BT: torch.Tensor):
    """Pad a micro-batch to the shape every rank of its expert group runs, at least to `r.pad_to`
    (a pipeline schedule's one activation shape), its length to `length_multiple`. Extra rows are
    padding with an empty response."""
    (b, length), t = ids_BL.shape, index_BT.shape[1]
    b, length = max(b, r.pad_to[0]), max(length, r.pad_to[1])
    shape = torch.tensor([b, length, t], device=r.device)  # NCCL groups take CUDA tensors only
    if r.expert_group is not None:
        dist.all_reduce(shape, op=dist.ReduceOp.MAX, group=r.expert_group)
    b2, length2, t2 = shape.tolist()
    multiple = length_multiple(r)
    length2 = -(-length2 // multiple) * multiple
    (b, length), t = ids_BL.shape, index_BT.shape[1]
    if (b2, length2, t2) == (b, length, t):
        return ids_BL, index_BT, mask_BT
    pad = torch.nn.functional.pad
    return (pad(ids_BL, (0, length2 - length, 0, b2 - b), value=r.pad_id),
            pad(index_BT, (0, t2 - t, 0, b2 - b)), pad(mask_BT, (0, t2 - t, 0, b2 - b)))


def common_tokens(r: MegatronRank, total: int) -> int:
    """A packed micro-batch's token count: the most of its expert group's ranks (their forwards
    exchange equal-sized token blocks), a multiple of `length_multiple`."""
    count = torch.tensor([total], device=r.device)
    if r.expert_group is not None:
        dist.all_reduce(count, op=dist.ReduceOp.MAX, group=r.expert_group)
    multiple = length_multiple(r)
    return -(-int(count.item()) // multiple) * multiple


def length_multiple(r: MegatronRank) -> int:
    """What a micro-batch's length is padded to a multiple of: the sequence is split over the
    tensor ranks under --sequence-parallel, and into 2C chunks under context parallelism (C with
    --allgather-cp)."""
    chunks = (r.cp_size if r.spec.model_parallel.allgather_cp else 2 * r.cp_size) if r.cp_size > 1 else 1
    return (r.tp_size if r.config.sequence_parallel else 1) * chunks
