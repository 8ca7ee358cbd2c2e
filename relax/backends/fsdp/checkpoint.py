"""Checkpoints of the fsdp backend: torch DCP shards of the model (and optimizer) state, a RNG file
per rank, and the HF export.

DCP writes each rank's shards and can load them into any number of ranks (`load_weights`: a
Reference taking the Actor's weights); a resume needs each rank's RNG file, so it runs with the
number of ranks that saved. The Trainer writes meta.json (step, LR schedule) beside them. With
--async-save (`snapshot`) DCP copies the shards to the host at the save and writes them in the
background.

With LoRA (`spec.lora`) a checkpoint holds the adapter tensors and their optimizer state only (the
base weights are the frozen --hf-checkpoint / --ref-load, loaded again on resume), and meta.json
records the adapter's shape (`lora`), which a resume must match. The HF export writes the merged
model (W0 + (alpha / r) B A: a plain checkpoint any loader takes) and the adapter itself in peft's
format under `<export>/adapter/` (docs/lora.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist

from relax.backends.lora import merged_state
from relax.utils.multimodal.models import copy_processor_files, is_multimodal, load_model
from relax.utils.peft_files import adapter_config, is_adapter_name, save_adapter


def _state(runner: Any, optimizer: Any, save_optim: bool) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(runner.model, optimizer or [])
    state = {"model": _saved_part(model_sd, runner.spec.lora is not None)}
    if save_optim:
        state["optim"] = optim_sd
    return state


def _meta(runner: Any) -> dict[str, Any]:
    lora = runner.spec.lora
    return {"world_size": runner.world_size, **({"lora": lora.as_dict()} if lora else {})}


def save(runner: Any, path: Path, optimizer: Any, save_optim: bool, rng: dict[str, Any]) -> dict[str, Any]:
    import torch.distributed.checkpoint as dcp

    dcp.save(_state(runner, optimizer, save_optim), checkpoint_id=str(path / "model"))
    torch.save(rng, path / f"rng_rank{runner.rank}.pt")
    return _meta(runner)


def snapshot(runner: Any, path: Path, optimizer: Any, save_optim: bool, rng: dict[str, Any],
             group: Any) -> tuple[dict[str, Any], Callable[[], None]]:
    """--async-save: DCP's `async_save` copies this rank's shards to the host now and writes them from
    a thread of its own, coordinating the ranks over `group` (a gloo group apart from the training
    collectives); returns (what rank 0 adds to meta.json, the wait for that write)."""
    import torch.distributed.checkpoint as dcp

    writing = dcp.async_save(_state(runner, optimizer, save_optim), checkpoint_id=str(path / "model"),
                             process_group=group)
    path.mkdir(parents=True, exist_ok=True)  # (DCP's writer thread may not have made it yet)
    torch.save(rng, path / f"rng_rank{runner.rank}.pt")
    return _meta(runner), writing.result


def _saved_part(model_sd: dict[str, Any], adapters_only: bool) -> dict[str, Any]:
    """What a checkpoint holds of the model: every weight, or with LoRA the adapter tensors only."""
    return {k: v for k, v in model_sd.items() if is_adapter_name(k)} if adapters_only else model_sd


def check_lora_meta(runner: Any, meta: dict[str, Any]) -> None:
    """A resume keeps the adapter's shape: ValueError naming the flags when the checkpoint was
    saved with other LoRA flags, or with / without LoRA against this run."""
    saved, lora = meta.get("lora"), runner.spec.lora
    if saved == (lora.as_dict() if lora else None):
        return
    if lora is None or saved is None:
        what = "LoRA adapters" if saved else "a full model (no --lora-rank)"
        raise ValueError(f"the checkpoint holds {what} but this run has --lora-rank {lora.rank if lora else 0}; "
                         "resume with the flags it was saved with, or point --load elsewhere")
    raise ValueError(f"the checkpoint's adapter {saved} differs from this run's --lora-rank / --lora-alpha / "
                     f"--lora-target-modules / --lora-dropout {lora.as_dict()}; resume with the same LoRA flags")


def load(runner: Any, path: Path, meta: dict[str, Any], optimizer: Any) -> dict[str, Any]:
    """Model (and optimizer) state into this rank's shards; returns this rank's saved RNG state."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

    check_lora_meta(runner, meta)
    model_sd, optim_sd = get_state_dict(runner.model, optimizer or [])
    adapters_only = runner.spec.lora is not None
    state = {"model": _saved_part(model_sd, adapters_only)}
    if meta["has_optim"] and optimizer is not None:
        state["optim"] = optim_sd
    dcp.load(state, checkpoint_id=str(path / "model"))
    set_state_dict(runner.model, optimizer or [], model_state_dict=state["model"],
                   optim_state_dict=state.get("optim", {}), options=StateDictOptions(strict=not adapters_only))
    rng_file = path / f"rng_rank{runner.rank}.pt"
    if not rng_file.exists():  # resuming without it would change every later sample
        saved = meta.get("world_size", "?")
        raise FileNotFoundError(f"{rng_file} is missing (the checkpoint was saved by {saved} ranks, this "
                                f"group has {runner.world_size}): resume with the same number of ranks "
                                "from a complete checkpoint")
    return torch.load(rng_file, weights_only=False)


def load_weights(model: torch.nn.Module, path: Path, adapters_only: bool = False) -> None:
    """Only the model weights of a checkpoint written by `save` (any world size); `adapters_only`:
    a LoRA checkpoint's adapter tensors (the base weights stay as loaded)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, set_model_state_dict

    state = {"model": _saved_part(get_model_state_dict(model), adapters_only)}
    dcp.load(state, checkpoint_id=str(path / "model"))
    set_model_state_dict(model, state["model"], options=StateDictOptions(strict=not adapters_only))


def export_hf(runner: Any, out_dir: str, tokenizer_path: str) -> None:
    """Write an HF checkpoint loadable by `AutoModelForCausalLM.from_pretrained` (a VL model's by
    `AutoModelForImageTextToText`, with its image processor)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from transformers import AutoTokenizer

    full = get_model_state_dict(runner.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    lora = runner.spec.lora
    if runner.rank == 0 and lora is not None:  # the adapter as peft files, then the merged model
        save_adapter(Path(out_dir) / "adapter", {k: v for k, v in full.items() if is_adapter_name(k)},
                     adapter_config(lora.rank, lora.alpha, lora.targets, lora.dropout, runner.spec.model_path))
        full = merged_state(full, lora)
    if runner.rank == 0:
        model = load_model(tokenizer_path, config=runner.hf_config, from_config=True)
        model.load_state_dict(full, strict=False)
        model.tie_weights()
        model.save_pretrained(out_dir, safe_serialization=True)
        AutoTokenizer.from_pretrained(tokenizer_path).save_pretrained(out_dir)
        if is_multimodal(runner.hf_config):  # its image / video processor, feature extractor
            copy_processor_files(tokenizer_path, out_dir)
    dist.barrier()
