"""Weights out of a megatron rank: the tensor- and expert-parallel shards gathered into full
Megatron tensors by the ranks of data-parallel shard 0, pipeline stages sent to rank 0, and
converted to HF names there (`convert.hf_tensors`; a VL model's through `vision.py`). The weight
push and the HF export both read `hf_state`; only rank 0 gets tensors, the others help gather.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

import torch
import torch.distributed as dist

from relax.backends.megatron.convert import expert_range, global_name, hf_tensors, is_expert, tp_dim, tp_merge
from relax.backends.megatron.grads import tied_copy

if TYPE_CHECKING:
    from relax.backends.megatron.rank import MegatronRank


def hf_state(r: MegatronRank, dtype: torch.dtype | None = None) -> Iterator[tuple[str, torch.Tensor, bool]]:
    """(HF name, full tensor, fresh) for every weight, on rank 0 (the others only help gather)."""
    own = {p.data_ptr() for p in r.model.parameters()}
    convert = r.vision.hf_tensors if r.vision else hf_tensors
    for hf_name, t in convert(gathered(r, dtype), r.arch):
        yield hf_name, t, t.data_ptr() not in own


def gathered(r: MegatronRank, dtype: torch.dtype | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """Full Megatron tensors under global names, on rank 0 (a collective: the ranks of
    data-parallel shard 0 gather tensor shards; expert ranks gather experts)."""
    stage = stage_tensors(r, dtype)
    if r.pp_size == 1:
        yield from stage
        return
    # Pipeline stages: each stage's leader (tensor, context and data-parallel rank 0) sends its
    # tensors to rank 0, stage after stage. The leaders are rank 0's pipeline group; another
    # rank's pipeline group (another tensor or data-parallel rank) holds no leader but stage 0's.
    leaders = dist.get_process_group_ranks(r.ps.get_pipeline_model_parallel_group())
    leader = r.tp_rank == 0 and r.cp_rank == 0 and r.dp_rank == 0
    if r.rank == 0:
        yield from stage
        for src in leaders[1:]:
            meta: list[Any] = [None]
            dist.recv_object_list(meta, src=src)
            for name, shape, dtype_ in meta[0]:
                t = torch.empty(shape, dtype=dtype_, device=r.device)
                dist.recv(t, src=src)
                yield name, t
    elif leader:
        tensors = list(stage)
        dist.send_object_list([[(n, tuple(t.shape), t.dtype) for n, t in tensors]], dst=0)
        for _, t in tensors:
            dist.send(t.contiguous(), dst=0)
    else:
        for _ in stage:  # help gather this stage's shards
            pass


def stage_tensors(r: MegatronRank, dtype: torch.dtype | None) -> Iterator[tuple[str, torch.Tensor]]:
    """This stage's full tensors under global names, on its leader (tensor rank 0 of
    data-parallel shard 0; the tied output-layer copy of a last stage left out)."""
    ps = r.ps
    dense_sender = r.dp_rank == 0 and r.cp_rank == 0
    # Expert shards: the expert tensor x expert group of expert-data-parallel copy 0 gathers them
    # (with --expert-tensor-parallel-size 1 its tensor ranks hold the same experts: rank 0 of them).
    expert_sender = ps.get_expert_data_parallel_rank() == 0 and (r.tp_rank == 0 or r.etp_size > 1)
    leader = dense_sender and r.tp_rank == 0
    tied = tied_copy(r)
    for name, p in r.model.named_parameters():
        if tied is p and not r.first_stage or name.startswith("value_head."):
            continue  # the critic's value head has no place in a causal-LM checkpoint
        # float32 out of bfloat16 weights (export): the main weights' own values
        t = (r.main[name] if dtype == torch.float32 and name in r.main else p).detach()
        if dtype is not None and t.is_floating_point() and t.dtype != dtype:
            t = t.to(dtype)
        if is_expert(name):
            if expert_sender:
                yield from _experts(r, name, t, leader)
            continue
        if not dense_sender:
            continue
        if r.tp_size > 1 and tp_dim(name) is not None:
            shards = [torch.empty_like(t) for _ in range(r.tp_size)]
            dist.all_gather(shards, t.contiguous(), group=ps.get_tensor_model_parallel_group())
            t = tp_merge(name, shards)
        if leader:
            yield global_name(name, r.layers, r.experts), t


def _experts(r: MegatronRank, name: str, t: torch.Tensor, leader: bool) -> Iterator[tuple[str, torch.Tensor]]:
    """An expert weight from every expert-parallel rank, under each one's global name (its
    --expert-tensor-parallel-size shards merged first)."""
    if r.etp_size > 1:
        shards = [torch.empty_like(t) for _ in range(r.etp_size)]
        dist.all_gather(shards, t.contiguous(), group=r.ps.get_expert_tensor_parallel_group())
        t = tp_merge(name, shards)
    parts = [t]
    if r.ep_size > 1:
        parts = [torch.empty_like(t) for _ in range(r.ep_size)]
        dist.all_gather(parts, t.contiguous(), group=r.ps.get_expert_model_parallel_group())
    if leader:
        for rank, part in enumerate(parts):
            yield global_name(name, r.layers, expert_range(r.arch.num_experts, r.ep_size, rank)), part


def export_hf(r: MegatronRank, out_dir: str, tokenizer_path: str) -> None:
    """An HF checkpoint (safetensors under the checkpoint's own names, config, tokenizer)."""
    from safetensors.torch import save_file
    from transformers import AutoTokenizer

    state = {name: t.contiguous().cpu() for name, t, _ in hf_state(r, torch.float32)}
    if r.rank == 0:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        if r.vision:  # through the HF model: its save writes the checkpoint's own names and layout
            from relax.distributed.weights.receiver import load_hf_named
            from relax.utils.multimodal.models import copy_processor_files, load_model

            model = load_model(tokenizer_path, config=r.hf_config, from_config=True)
            load_hf_named(model, state)  # experts per expert into transformers' fused ones
            model.tie_weights()
            model.save_pretrained(out, safe_serialization=True)
            copy_processor_files(tokenizer_path, str(out))
        else:
            save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
        r.hf_config.save_pretrained(out)
        AutoTokenizer.from_pretrained(tokenizer_path).save_pretrained(out)
        gen = Path(tokenizer_path) / "generation_config.json"
        if gen.exists():
            (out / "generation_config.json").write_text(gen.read_text())
    dist.barrier()
