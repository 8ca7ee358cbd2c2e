"""megatron-core's decoder layers made compilable by `torch.compile` (--use-torch-compile).

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
`compile_layers` installs it and compiles each decoder layer, as the worker does.

One more break is a layer's own setting: with tensor parallelism (and no sequence parallelism) a
`ColumnParallelLinear` all-reduces its input's gradient in its backward with `async_op=True`, to run
beside the weight-gradient matmul; dynamo cannot trace an async collective, and each one split the
compiled layer (a 2x H200 profile at TP=2: 14 breaks, its elementwise work unfused). `compile_layers`
sets such a layer's `allreduce_dgrad` off, which makes megatron take its other path for the same
sum: the input goes through `copy_to_tensor_model_parallel_region`, whose backward all-reduces it
synchronously, which dynamo traces as a functional collective; inductor then schedules that
collective itself. The gradients are the same sum. With sequence parallelism the linear's own
all-gather and reduce-scatter of its backward are async too: there the input is gathered beforehand
by `gather_from_sequence_parallel_region` (traced) and the linear runs as a plain one.

The sequence-parallel mappings themselves (that all-gather, and the row-parallel linears' reduce-scatter of
their output) are megatron autograd Functions whose forward writes into a tensor it allocated. Compiled
through AOT autograd (inductor, aot_eager) with megatron-core 0.19 and torch 2.11, the reduce-scatter's
output got no gradient: its backward ran on zeros, and every linear before it trained on nothing (a 2x
H200 parity run: gradient norm 3.85 against fsdp's 5.07; right in float32 on CPU with 0.16 and torch 2.13).
While compiling, both go through torch's differentiable functional collectives instead
(`reduce_scatter_tensor_autograd`, `all_gather_tensor_autograd`): the same sums, traced with their
gradients (tests/unit/backends/test_megatron_gpu.py, the compiled layouts). The gather is done by one
function on the class (`_gathering_forward`), not one set on each linear: dynamo guards on such a
function's identity, so each layer compiled again and, past the recompile limit (8), a 12-layer model's
last four layers ran uncompiled.

A MoE layer's expert block (`MoELayer`: routing, token dispatch, experts) is data-dependent (`.item()`
token counts, `masked_select`) and compiled through AOT autograd it failed (inductor on GPUs: a mask that is
not boolean in the dispatcher; aot_eager on CPU: an invalid output node). It runs uncompiled inside the
compiled layer (`torch.compiler.disable`): the attention, norms and residuals around it stay compiled, with
one graph break per layer call."""

from __future__ import annotations

import functools
from collections.abc import Iterable

import torch

_INSTALLED = False
_GATHER = None  # install(): megatron's sequence-parallel all-gather, or `_all_gather` while compiling


def install() -> None:
    global _INSTALLED, _GATHER
    if _INSTALLED:
        return
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import layers
    from megatron.core.tensor_parallel.mappings import gather_from_sequence_parallel_region
    from megatron.core.transformer import transformer_layer
    from megatron.core.transformer.moe.moe_layer import MoELayer

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
    layers.reduce_scatter_to_sequence_parallel_region = _differentiable_when_compiled(
        layers.reduce_scatter_to_sequence_parallel_region, _reduce_scatter)
    _GATHER = _differentiable_when_compiled(gather_from_sequence_parallel_region, _all_gather)
    layers.ColumnParallelLinear.forward = _gathering_forward(layers.ColumnParallelLinear.forward)
    # The MoE block runs uncompiled inside a compiled layer (one function on the class: see _gathering_forward)
    MoELayer.forward = torch.compiler.disable(MoELayer.forward)
    _INSTALLED = True


def _gathering_forward(forward):
    """ColumnParallelLinear's forward, which first gathers its input over the linear's tensor-parallel
    group where `traceable_tensor_parallel` marked the linear (`_relax_gathers_input`). One function on
    the class for every linear: a function set on each linear would be a different object in each
    layer, which dynamo guards on, so each layer would compile again, and past its recompile limit (8)
    the remaining layers would run uncompiled (a 12-layer run at TP=2 with sequence parallelism did)."""

    @functools.wraps(forward)
    def gathering(self, input_, *args, **kwargs):
        if getattr(self, "_relax_gathers_input", False):
            input_ = _GATHER(input_, group=self.tp_group)
        return forward(self, input_, *args, **kwargs)

    gathering._relax_gathering = True
    return gathering


def _differentiable_when_compiled(region, collective):
    """`region` (a megatron sequence-parallel mapping) as itself, but while compiling as `collective`:
    the same sum through torch's differentiable functional collectives (module doc)."""

    @functools.wraps(region)
    def mapped(input_, *args, group=None, **kwargs):
        if not torch.compiler.is_compiling() or args or any(kwargs.values()):  # (split sizes, global buffers)
            return region(input_, *args, group=group, **kwargs)
        from megatron.core import parallel_state

        group = group if group is not None else parallel_state.get_tensor_model_parallel_group()
        return input_ if group.size() == 1 else collective(input_.contiguous(), group)

    return mapped


def _reduce_scatter(input_: torch.Tensor, group) -> torch.Tensor:
    """Forward: the sum over `group`, each rank its slice of the first dim; backward: the all-gather."""
    from torch.distributed._functional_collectives import reduce_scatter_tensor_autograd

    return reduce_scatter_tensor_autograd(input_, "sum", 0, group)


def _all_gather(input_: torch.Tensor, group) -> torch.Tensor:
    """Forward: the first dim gathered over `group`; backward: the sum of the gradient, each rank its slice."""
    from torch.distributed._functional_collectives import all_gather_tensor_autograd

    return all_gather_tensor_autograd(input_, 0, group)


def compile_layers(layers: Iterable[torch.nn.Module], backend: str = "inductor") -> None:
    """--use-torch-compile: each decoder layer one compiled graph (dynamic shapes: rows and
    lengths change from batch to batch)."""
    install()
    for layer in layers:
        traceable_tensor_parallel(layer)
        layer.compile(backend=backend, dynamic=True)


def traceable_tensor_parallel(layer: torch.nn.Module) -> int:
    """Make `layer`'s column-parallel linears traceable (module doc); returns how many were changed.
    Without sequence parallelism: `allreduce_dgrad` off (the input then goes through
    `copy_to_tensor_model_parallel_region`). With it, whose backward reduce-scatters (and re-gathers the
    input) with `async_op=True`: the linear runs as a plain one (`sequence_parallel` off, its input's
    gradient not reduced) on an input gathered by `gather_from_sequence_parallel_region`, whose forward
    all-gathers and backward reduce-scatters synchronously (traced; the same sums)."""
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear

    install()
    changed = 0
    for module in layer.modules():
        if not isinstance(module, ColumnParallelLinear) or module.explicit_expert_comm:
            continue
        if module.allreduce_dgrad:
            module.allreduce_dgrad = False  # (its forward then copies its input to the region: same sum)
            changed += 1
        elif module.sequence_parallel and not module.disable_grad_reduce:
            if not getattr(type(module).forward, "_relax_gathering", False):
                raise TypeError(f"{type(module).__name__} overrides ColumnParallelLinear.forward, so "
                                "--use-torch-compile cannot gather its sequence-parallel input "
                                "(relax/backends/megatron/compile_shim.py): drop --sequence-parallel or "
                                "--use-torch-compile")
            module.sequence_parallel, module.disable_grad_reduce = False, True
            module._relax_gathers_input = True
            changed += 1
    return changed
