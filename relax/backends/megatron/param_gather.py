"""`--overlap-param-gather` (with `--use-distributed-optimizer`): the updated weights' broadcast
after each ZeRO-1 step is left in flight and waited for by the next forward, layer by layer
(megatron-core's overlapped parameter all-gather with its distributed optimizer).

Under ZeRO-1 (torch's `ZeroRedundancyOptimizer`, `relax.backends.trainer.optim`) each rank steps
its share of the weights, then broadcasts it to the other data-parallel ranks and waits. Here the
step launches the same broadcasts (`ZeroRedundancyOptimizer._broadcast_params_from_rank`, one
asynchronous broadcast per weight; the wrapper's `_sync_params` is replaced on this instance) and
returns. A forward pre-hook on the model waits for the weights outside the decoder layers (the
embedding, final norm, output layer, value head, encoders) and one on each decoder layer waits for
that layer's, so the broadcasts of later layers arrive while earlier layers compute. Under --bf16
the broadcast weights are the float32 main weights: each bfloat16 model weight takes its main
weight's value when it is waited for (`defer_casts` replaces the runner's cast after the step).
Whatever reads the weights outside a forward (the next step's gradient reduction, a push, a
checkpoint, an export, an offload) calls `settle_all` first. `last_launch` counts the broadcasts
of the last step; `in_flight` is how many are still unwaited.

Relies on two private methods of torch's ZeroRedundancyOptimizer (unchanged from torch 2.0 to
2.13, the pin); the check in `ParamGather.__init__` names them if a torch version drops them.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

ZERO_METHODS = ("_broadcast_params_from_rank", "_partition_parameters", "_sync_params")


def wait_groups(model: torch.nn.Module) -> list[tuple[torch.nn.Module, list[torch.nn.Parameter]]]:
    """(module whose forward pre-hook waits, the weights it waits for): the model root for every
    weight outside the decoder layers, then each decoder layer for its own."""
    layers = list(getattr(getattr(model, "decoder", None), "layers", []))
    inside = {id(p) for layer in layers for p in layer.parameters()}
    rest = [p for p in model.parameters() if id(p) not in inside]
    return [(model, rest)] + [(layer, list(layer.parameters())) for layer in layers]


class ParamGather:
    """`ParamGather(zero, model, main)`: see the module doc; `main` maps weight names to their
    float32 main weights under --bf16 (empty otherwise)."""

    def __init__(self, zero: Any, model: torch.nn.Module, main: dict[str, torch.nn.Parameter]) -> None:
        missing = [m for m in ZERO_METHODS if not hasattr(zero, m)]
        if missing:
            raise RuntimeError(f"--overlap-param-gather needs torch's ZeroRedundancyOptimizer with {missing}; this "
                               "torch has none: drop --overlap-param-gather")
        self.zero = zero
        # the tensor ZeRO steps and broadcasts for each model weight: its main weight, else itself
        self.source = {id(p): main.get(name, p) for name, p in model.named_parameters()}
        self.weights = {id(p): p for p in model.parameters()}
        self.pending: dict[int, Any] = {}  # id(broadcast tensor) -> its work handle
        self.stale: set[int] = set()  # ids of bf16 model weights still to take their main weight's value
        self.last_launch = 0
        zero._sync_params = self.launch  # ZeRO's step calls it after the local step
        for module, weights in wait_groups(model):
            if weights:
                module.register_forward_pre_hook(functools.partial(self._before_forward, weights))

    @property
    def in_flight(self) -> int:
        return len(self.pending)

    def launch(self) -> None:
        """ZeRO-1's post-step broadcasts, launched and left in flight."""
        self.settle_all()  # the previous step's, if nothing waited for them
        zero = self.zero
        for rank in range(zero.world_size):
            handles = zero._broadcast_params_from_rank(rank)
            weights = [p for group in zero._partition_parameters()[rank] for p in group["params"]]
            self.pending.update((id(p), h) for p, h in zip(weights, handles))
        self.last_launch = len(self.pending)

    def defer_casts(self, weights: list[torch.Tensor]) -> None:
        """--bf16: these model weights take their main weights' values when waited for."""
        self.stale.update(id(w) for w in weights)

    def _before_forward(self, weights: list[torch.nn.Parameter], _module: Any, _args: Any) -> None:
        if self.pending or self.stale:
            self.settle(weights)

    @torch.no_grad()
    def settle(self, weights: list[torch.Tensor]) -> None:
        """Wait for these model weights' broadcasts and apply their deferred casts."""
        for w in weights:
            source = self.source.get(id(w), w)
            work = self.pending.pop(id(source), None)
            if work is not None:
                work.wait()
            if id(w) in self.stale:
                self.stale.discard(id(w))
                w.copy_(source)

    def settle_all(self) -> None:
        for work in self.pending.values():
            work.wait()
        self.pending.clear()
        if self.stale:
            self.settle([self.weights[i] for i in list(self.stale)])
