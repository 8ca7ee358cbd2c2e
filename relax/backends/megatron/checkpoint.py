"""Checkpoints of the megatron backend: one file per rank with its own shards (model, float32 main
weights under --bf16, optimizer state, RNG), named by its place in the layout, plus the layout in
meta.json. A resume needs the same layout (a different one: export HF and start from it); loading
only the weights (a Reference taking the Actor's) needs the same model-parallel layout and any
number of data-parallel ranks. With --async-save (`snapshot`) the same file is written by a
background thread from a host copy of the state taken at the save.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import torch

from relax.backends.trainer.optim import local_optimizer
from relax.backends.trainer.runner_kit import host_copy

if TYPE_CHECKING:
    from relax.backends.megatron.rank import MegatronRank


def rank_file(r: MegatronRank, path: Path) -> Path:
    # Context-parallel ranks hold the same weights; rank 0's file keeps the name the converter reads.
    # With --expert-tensor-parallel-size > 1 data-parallel ranks may hold different expert shards.
    cp = f"_cp{r.cp_rank}" if r.cp_rank else ""
    etp = f"_etp{r.etp_rank}" if r.etp_size > 1 else ""
    return path / "model" / f"tp{r.tp_rank}_pp{r.pp_rank}_ep{r.ep_rank}{etp}{cp}_dp{r.dp_rank}.pt"


def layout_meta(r: MegatronRank) -> dict[str, Any]:
    mp = r.spec.model_parallel
    return {"world_size": r.world_size, "tp": r.tp_size, "pp": r.pp_size, "ep": r.ep_size, "cp": r.cp_size,
            "etp": r.etp_size, "first_stage_layers": mp.first_stage_layers, "last_stage_layers": mp.last_stage_layers}


def _saved_layout(meta: dict[str, Any], keys: Any) -> dict[str, Any]:
    return {k: meta.get(k, 1 if k in ("cp", "etp") else None) for k in keys}


def _state(r: MegatronRank, optimizer: Any, save_optim: bool, rng: dict[str, Any]) -> dict[str, Any]:
    state: dict[str, Any] = {"model": r.model.state_dict(), "main": {n: m.data for n, m in r.main.items()}}
    if save_optim:
        state["optim"] = local_optimizer(optimizer).state_dict()
    state["rng"] = rng
    return state


def save(r: MegatronRank, path: Path, optimizer: Any, save_optim: bool, rng: dict[str, Any]) -> dict[str, Any]:
    """This rank's file; returns the layout rank 0 records in meta.json."""
    (path / "model").mkdir(parents=True, exist_ok=True)
    torch.save(_state(r, optimizer, save_optim, rng), rank_file(r, path))
    return {"backend": "megatron", **layout_meta(r)}


def snapshot(r: MegatronRank, path: Path, optimizer: Any, save_optim: bool,
             rng: dict[str, Any]) -> tuple[dict[str, Any], Callable[[], None]]:
    """--async-save: this rank's state copied to the host now; returns (the layout for meta.json,
    the write of `save`'s file from that copy, for a background thread)."""
    (path / "model").mkdir(parents=True, exist_ok=True)
    state, file = host_copy(_state(r, optimizer, save_optim, rng)), rank_file(r, path)
    return {"backend": "megatron", **layout_meta(r)}, lambda: torch.save(state, file)


def load(r: MegatronRank, path: Path, meta: dict[str, Any], optimizer: Any) -> dict[str, Any]:
    """This rank's shards, main weights and optimizer state; returns its saved RNG state."""
    saved = _saved_layout(meta, layout_meta(r))
    if meta.get("backend") != "megatron" or saved != layout_meta(r):
        raise ValueError(f"{path} was saved by {meta.get('backend', 'fsdp')} ranks laid out as {saved}; this "
                         f"group is megatron {layout_meta(r)}: resume with the same layout, or start "
                         "from its HF export (--save-hf) with --hf-checkpoint")
    state = torch.load(rank_file(r, path), weights_only=False)
    r.model.load_state_dict(state["model"])
    with torch.no_grad():
        for name, value in state.get("main", {}).items():
            r.main[name].copy_(value)
    if "optim" in state and optimizer is not None:
        local_optimizer(optimizer).load_state_dict(state["optim"])
    return state["rng"]


def load_weights(r: MegatronRank, path: Path) -> None:
    """Only the model weights: the same tensor / pipeline / expert / context layout, any number of
    data-parallel ranks (every data-parallel copy of this rank's shards holds the same weights:
    the lowest is read)."""
    meta = json.loads((path / "meta.json").read_text())
    mine = {k: v for k, v in layout_meta(r).items() if k != "world_size"}
    saved = _saved_layout(meta, mine)
    if meta.get("backend") != "megatron" or saved != mine:
        raise ValueError(f"{path} was saved by {meta.get('backend', 'fsdp')} ranks laid out as {saved}; these "
                         f"megatron ranks are {mine}: give them the same model-parallel layout")
    stem = rank_file(r, path).name.rsplit("_dp", 1)[0]
    copies = sorted((path / "model").glob(f"{stem}_dp*.pt"), key=lambda f: int(f.stem.rsplit("_dp", 1)[1]))
    if not copies:
        raise FileNotFoundError(f"{path}/model has no {stem}_dp*.pt: an incomplete checkpoint")
    r.model.load_state_dict(torch.load(copies[0], weights_only=False)["model"])
