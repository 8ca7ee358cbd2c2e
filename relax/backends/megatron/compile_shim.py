"""Two megatron-core calls made traceable by `torch.compile` (--use-torch-compile).

A compiled decoder layer runs as one graph only if dynamo can trace every call in it. Two calls
in megatron-core's layers (0.16 and 0.19) break the graph, and a break splits the layer into
several graphs whose elementwise work (norms, residual adds, SwiGLU, rotary) is no longer fused
(an H100 profile of a Qwen3-0.6B-shaped step: 10 compiled regions per layer instead of 1):

- `RowParallelLinear.forward` passes `tp_group=None` to
  `linear_with_grad_accumulation_and_async_allreduce`, whose
  `get_tensor_model_parallel_group_if_none` calls `warnings.warn` on rank 0 (dynamo cannot
  trace it). While compiling, the default group is returned without the warning.
- `TransformerLayer` ends with `make_viewless_tensor`, which assigns `.data` (dynamo only
  allows that on tensors made outside the graph). While compiling, the tensor is returned as
  it is: the values are the same, and the compiled graph holds no view to drop.

Outside a compiled region both behave exactly as before. `install()` is idempotent;
`compile_layers` installs it and compiles each decoder layer, as the worker does."""

from __future__ import annotations

import functools
from collections.abc import Iterable

import torch

_INSTALLED = False


def install() -> None:
    global _INSTALLED
    if _INSTALLED:
        return
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import layers
    from megatron.core.transformer import transformer_layer

    group_if_none = layers.get_tensor_model_parallel_group_if_none

    @functools.wraps(group_if_none)
    def traceable_group_if_none(tp_group=None, is_expert=False, check_initialized=True):
        if tp_group is None and torch.compiler.is_compiling() and parallel_state.is_initialized():
            if is_expert:
                return parallel_state.get_expert_tensor_parallel_group(check_initialized=check_initialized)
            return parallel_state.get_tensor_model_parallel_group(check_initialized=check_initialized)
        return group_if_none(tp_group, is_expert=is_expert, check_initialized=check_initialized)

    viewless = transformer_layer.make_viewless_tensor

    @functools.wraps(viewless)
    def traceable_viewless(inp, requires_grad, keep_graph):
        return inp if torch.compiler.is_compiling() else viewless(inp, requires_grad, keep_graph)

    layers.get_tensor_model_parallel_group_if_none = traceable_group_if_none
    transformer_layer.make_viewless_tensor = traceable_viewless
    _INSTALLED = True


def compile_layers(layers: Iterable[torch.nn.Module], backend: str = "inductor") -> None:
    """--use-torch-compile: each decoder layer one compiled graph (dynamic shapes: rows and
    lengths change from batch to batch)."""
    install()
    for layer in layers:
        layer.compile(backend=backend, dynamic=True)
