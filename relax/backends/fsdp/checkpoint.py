"""Checkpoints of the fsdp backend: torch DCP shards of the model (and optimizer) state, a RNG file
per rank, and the HF export.

DCP writes each rank's shards and can load them into any number of ranks (`load_weights`: a
Reference taking the Actor's weights); a resume needs each rank's RNG file, so it runs with the
number of ranks that saved. The Trainer writes meta.json (step, LR schedule) beside them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from relax.utils.multimodal.models import copy_processor_files, is_multimodal, load_model


def save(runner: Any, path: Path, optimizer: Any, save_optim: bool, rng: dict[str, Any]) -> dict[str, Any]:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(runner.model, optimizer or [])
    state = {"model": model_sd}
    if save_optim:
        state["optim"] = optim_sd
    dcp.save(state, checkpoint_id=str(path / "model"))
    torch.save(rng, path / f"rng_rank{runner.rank}.pt")
    return {"world_size": runner.world_size}


def load(runner: Any, path: Path, meta: dict[str, Any], optimizer: Any) -> dict[str, Any]:
    """Model (and optimizer) state into this rank's shards; returns this rank's saved RNG state."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_sd, optim_sd = get_state_dict(runner.model, optimizer or [])
    state = {"model": model_sd}
    if meta["has_optim"] and optimizer is not None:
        state["optim"] = optim_sd
    dcp.load(state, checkpoint_id=str(path / "model"))
    set_state_dict(runner.model, optimizer or [], model_state_dict=state["model"],
                   optim_state_dict=state.get("optim", {}))
    rng_file = path / f"rng_rank{runner.rank}.pt"
    if not rng_file.exists():  # resuming without it would change every later sample
        saved = meta.get("world_size", "?")
        raise FileNotFoundError(f"{rng_file} is missing (the checkpoint was saved by {saved} ranks, this "
                                f"group has {runner.world_size}): resume with the same number of ranks "
                                "from a complete checkpoint")
    return torch.load(rng_file, weights_only=False)


def load_weights(model: torch.nn.Module, path: Path) -> None:
    """Only the model weights of a checkpoint written by `save` (any world size)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

    state = {"model": get_model_state_dict(model)}
    dcp.load(state, checkpoint_id=str(path / "model"))
    set_model_state_dict(model, state["model"])


def export_hf(runner: Any, out_dir: str, tokenizer_path: str) -> None:
    """Write an HF checkpoint loadable by `AutoModelForCausalLM.from_pretrained` (a VL model's by
    `AutoModelForImageTextToText`, with its image processor)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from transformers import AutoTokenizer

    full = get_model_state_dict(runner.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if runner.rank == 0:
        model = load_model(tokenizer_path, config=runner.hf_config, from_config=True)
        model.load_state_dict(full, strict=False)
        model.tie_weights()
        model.save_pretrained(out_dir, safe_serialization=True)
        AutoTokenizer.from_pretrained(tokenizer_path).save_pretrained(out_dir)
        if is_multimodal(runner.hf_config):  # its image / video processor, feature extractor
            copy_processor_files(tokenizer_path, out_dir)
    dist.barrier()
