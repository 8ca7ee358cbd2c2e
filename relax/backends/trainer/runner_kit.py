"""What the backends' model runners share: the one-stage micro-batch schedule, the throwaway
row of an empty micro-batch, parameter freezing, the RNG state a checkpoint keeps, and the host
copy an asynchronous checkpoint (--async-save) writes from.

A runner without pipeline parallelism runs a list of micro-batches one after another:
forward, the micro-batch's loss, backward. Gradient reduction may happen inside backward
(FSDP reduce-scatters there): `grad_sync(last)` is called before each backward with whether it
is the step's last one, so ranks reduce once per optimizer step.
"""

from __future__ import annotations

import random
import re
from typing import Any, Callable

import torch

from relax.backends.base import LossFn, Rows, Scores
from relax.config.schema import OptimizerConfig

# One micro-batch's forward: (rows, entropy, entropy_grad) -> Scores.
Forward = Callable[[Rows, bool, bool], Scores]

THROWAWAY = Rows(tokens=[[0, 0]], response_lengths=[1])  # an empty micro-batch's forward (passes.even_out)


def sequential_run(forward: Forward, micro: list[Rows], loss: LossFn | None, *, entropy: bool,
                   entropy_grad: bool, ends_step: bool,
                   grad_sync: Callable[[bool], None] = lambda last: None) -> list[Any]:
    """Micro-batches in order: forward, then (with `loss`) the loss and its backward. Returns the
    loss outputs, or without `loss` each micro-batch's scores."""
    out: list[Any] = []
    for k, rows in enumerate(micro):
        scores = forward(rows, entropy, entropy_grad)
        if loss is None:
            out.append(scores)
            continue
        result = loss(k, scores)
        grad_sync(ends_step and k == len(micro) - 1)
        result.loss.backward()
        out.append(result)
    return out


def apply_freezing(model: torch.nn.Module, optim: OptimizerConfig) -> None:
    """--only-train-params-name-list / --freeze-params-name-list (regexes over parameter names)."""
    only, frozen = optim.only_train_params_name_list, optim.freeze_params_name_list
    if not (only or frozen):
        return
    for name, p in model.named_parameters():
        if only:
            p.requires_grad_(any(re.search(pat, name) for pat in only))
        elif frozen and any(re.search(pat, name) for pat in frozen):
            p.requires_grad_(False)


def rng_state() -> dict[str, Any]:
    """This process's random states (Python, torch, CUDA), as a checkpoint keeps them."""
    return {"torch": torch.get_rng_state(), "python": random.getstate(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}


def set_rng_state(rng: dict[str, Any]) -> None:
    torch.set_rng_state(rng["torch"])
    random.setstate(rng["python"])
    if rng.get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])


def host_copy(state: Any) -> Any:
    """`state` (nested dicts, lists, tuples) with every tensor copied to the host: a snapshot that
    later steps do not change (--async-save writes it while training goes on)."""
    if isinstance(state, torch.Tensor):
        return state.detach().to("cpu", copy=True)
    if isinstance(state, dict):
        return {k: host_copy(v) for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(host_copy(v) for v in state)
    return state
