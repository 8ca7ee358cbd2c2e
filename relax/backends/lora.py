"""LoRA adapters on an HF model, shared by the fsdp trainer and the hf engine (docs/lora.md).

Every targeted `nn.Linear` (weight W0 [out, in]) keeps its weight and its HF name, and gets two child
layers and a forward hook (Hu et al. 2021, arXiv 2106.09685; initialised as peft does: A kaiming-
uniform with a = sqrt(5), B zeros, so a fresh adapter is the base model):

    lora_A: Linear(in, r)      lora_B: Linear(r, out)
    y = W0 x (+ bias) + (alpha / r) * lora_B(lora_A(dropout(x)))

Because W0 is never changed, loading new adapter tensors replaces the delta (successive pushes do not
accumulate), `adapters_off(model)` gives back the base model (the Reference, with no second copy of
the weights), and the trainer and the engine compute the same thing with the same code. Adapter
tensors are named as peft names them without its wrapper prefix, `<module>.lora_A.weight` /
`<module>.lora_B.weight` (`model.layers.0.self_attn.q_proj.lora_A.weight`); `merged_state` folds
them into W0 for an HF export (W = W0 + (alpha / r) B A).

Targets follow peft: a name matches every module whose dotted name is it or ends with `.<name>`;
`all-linear` is every `nn.Linear` except the output layer. The child layers live inside the targeted
module, so FSDP2's `fully_shard` of a decoder layer shards them with it (frozen W0 and trainable
adapters in one group, which FSDP2 supports).
"""

from __future__ import annotations

import contextlib
import math
from typing import Iterator

import torch
from torch import nn

from relax.config.lora import ALL_LINEAR, LoraSpec
from relax.utils.peft_files import is_adapter_name

_SWITCH = "_relax_lora_switch"  # the model attribute holding the on/off switch of its adapters


class _Switch:
    """Whether a model's adapters are applied (one per model, read by every hook)."""

    def __init__(self) -> None:
        self.on = True


def _matches(name: str, targets: tuple[str, ...]) -> bool:
    return any(name == t or name.endswith("." + t) for t in targets)


def target_linears(model: nn.Module, targets: tuple[str, ...]) -> dict[str, nn.Linear]:
    """The linear layers `targets` selects, by dotted name (see the module doc); ValueError naming
    `--lora-target-modules` and the model's linear layers when nothing matches."""
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    linears = {n: m for n, m in model.named_modules()
               if isinstance(m, nn.Linear) and m is not output and not n.endswith((".lora_A", ".lora_B"))}
    found = linears if ALL_LINEAR in targets else {n: m for n, m in linears.items() if _matches(n, targets)}
    if not found:
        leaves = sorted({n.rsplit(".", 1)[-1] for n in linears})
        raise ValueError(f"--lora-target-modules {','.join(targets)} matches no linear layer of the model; "
                         f"its linear layers are named {', '.join(leaves) or '(none)'} (or use all-linear)")
    return found


def _adapt(linear: nn.Linear, spec: LoraSpec, switch: _Switch) -> None:
    """Give `linear` its adapter layers and the hook that adds their output."""
    w = linear.weight
    linear.lora_A = nn.Linear(linear.in_features, spec.rank, bias=False, device=w.device, dtype=w.dtype)
    linear.lora_B = nn.Linear(spec.rank, linear.out_features, bias=False, device=w.device, dtype=w.dtype)
    nn.init.kaiming_uniform_(linear.lora_A.weight, a=math.sqrt(5))
    nn.init.zeros_(linear.lora_B.weight)
    linear.lora_dropout = nn.Dropout(spec.dropout) if spec.dropout > 0 else nn.Identity()
    scaling = spec.scaling

    def add_delta(module: nn.Linear, args: tuple, out: torch.Tensor) -> torch.Tensor:
        if not switch.on:
            return out
        x = module.lora_dropout(args[0])  # [..., in]
        return out + module.lora_B(module.lora_A(x)) * scaling  # [..., out]

    linear.register_forward_hook(add_delta)


def add_adapters(model: nn.Module, spec: LoraSpec) -> list[str]:
    """Adapters on every linear layer `spec.targets` selects, and every other parameter frozen
    (`requires_grad=False`). Returns the adapted modules' names."""
    if getattr(model, _SWITCH, None) is not None:
        raise ValueError("the model already has LoRA adapters")
    found = target_linears(model, spec.targets)
    model.requires_grad_(False)
    switch = _Switch()
    for linear in found.values():
        _adapt(linear, spec, switch)
    object.__setattr__(model, _SWITCH, switch)  # a plain attribute: not a module, buffer or parameter
    return sorted(found)


def has_adapters(model: nn.Module) -> bool:
    return getattr(model, _SWITCH, None) is not None


@contextlib.contextmanager
def adapters_off(model: nn.Module) -> Iterator[None]:
    """The base model for the duration (the Reference): every adapter skipped. A no-op on a model
    without adapters."""
    switch = getattr(model, _SWITCH, None)
    if switch is None:
        yield
        return
    was, switch.on = switch.on, False
    try:
        yield
    finally:
        switch.on = was


def adapter_parameters(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """(name, parameter) of every adapter tensor, in module order."""
    return [(n, p) for n, p in model.named_parameters() if is_adapter_name(n)]


@torch.no_grad()
def merged_state(state: dict[str, torch.Tensor], spec: LoraSpec) -> dict[str, torch.Tensor]:
    """A full state dict with adapters -> the plain HF state: every adapted `<module>.weight`
    replaced by W0 + (alpha / r) B A (in float32, cast back), the adapter tensors dropped."""
    out = {n: t for n, t in state.items() if not is_adapter_name(n)}
    for name in state:
        if not name.endswith(".lora_A.weight"):
            continue
        module = name.removesuffix(".lora_A.weight")
        w0, a_RI, b_OR = out[f"{module}.weight"], state[name], state[f"{module}.lora_B.weight"]
        delta_OI = (b_OR.float() @ a_RI.float()) * spec.scaling
        out[f"{module}.weight"] = (w0.float() + delta_OI.to(w0.device)).to(w0.dtype)
    return out
