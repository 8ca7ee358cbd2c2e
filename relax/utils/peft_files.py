"""A LoRA adapter on disk in the `peft` package's format, written and read without peft.

`adapter_config.json` (peft_type LORA, r, lora_alpha, target_modules, lora_dropout, ...) and
`adapter_model.safetensors`, whose tensor names are the model's own with peft's wrapper prefix
`base_model.model.` (`base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`). What
`PeftModel.from_pretrained` loads and what SGLang's `/load_lora_adapter` (and `--lora-paths`) reads.
In memory, Relax names adapter tensors without the prefix (`model.layers.0.self_attn.q_proj.lora_A.weight`).

Used by the fsdp export (`--save-hf` writes the adapter beside the merged model) and by the weight
push to SGLang engines (`relax.distributed.weights.adapter_files`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

PEFT_PREFIX = "base_model.model."
CONFIG_FILE, WEIGHTS_FILE = "adapter_config.json", "adapter_model.safetensors"
ALL_LINEAR = "all-linear"


def is_adapter_name(name: str) -> bool:
    """An adapter tensor's name: `<module>.lora_A.weight` or `<module>.lora_B.weight`."""
    return ".lora_A." in name or ".lora_B." in name


def adapter_config(rank: int, alpha: float, targets: list[str] | tuple[str, ...], dropout: float,
                   base_model: str | None) -> dict[str, Any]:
    """peft's LoraConfig as adapter_config.json holds it (the fields loaders read)."""
    target: str | list[str] = ALL_LINEAR if list(targets) == [ALL_LINEAR] else list(targets)
    return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": alpha,
            "target_modules": target, "lora_dropout": dropout, "bias": "none", "use_rslora": False,
            "use_dora": False, "fan_in_fan_out": False, "modules_to_save": None, "inference_mode": True,
            "base_model_name_or_path": base_model}


def save_adapter(out_dir: str | Path, tensors: dict[str, torch.Tensor], config: dict[str, Any]) -> Path:
    """Write `tensors` (Relax's names) and `config` (`adapter_config`) as a peft adapter directory.
    The weights file is written under a temporary name and renamed, so a reader never sees half of it."""
    from safetensors.torch import save_file

    bad = sorted(n for n in tensors if not is_adapter_name(n))
    if bad:
        raise ValueError(f"{len(bad)} tensor(s) are not LoRA adapter weights, e.g. {bad[:2]}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    staged = out / (WEIGHTS_FILE + ".tmp")
    save_file({PEFT_PREFIX + n: t.detach().contiguous().cpu() for n, t in tensors.items()}, str(staged))
    (out / CONFIG_FILE).write_text(json.dumps(config, indent=2))
    os.replace(staged, out / WEIGHTS_FILE)
    return out


def load_adapter(path: str | Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(adapter_config.json, tensors by Relax's names) of a peft adapter directory."""
    from safetensors.torch import load_file

    path = Path(path)
    config = json.loads((path / CONFIG_FILE).read_text())
    tensors = load_file(str(path / WEIGHTS_FILE))
    return config, {n.removeprefix(PEFT_PREFIX): t for n, t in tensors.items()}
