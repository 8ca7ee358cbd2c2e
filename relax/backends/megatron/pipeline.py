"""Pipeline parallelism: a step's micro-batches through the stages with megatron-core's 1F1B
schedule (forward only when scoring).

This is the megatron runner's schedule (`MegatronRunner.run` with
`--pipeline-model-parallel-size` > 1): every micro-batch is padded to one activation shape (the
schedule's `seq_length` x `micro_batch_size`), the last stage computes each micro-batch's loss
(already normalised by the step's tokens: no rescaling by the schedule) or its scores, and the
other stages return nothing. The Trainer feeds it whole optimizer steps (`whole_step`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from relax.backends.base import LossFn, Rows
from relax.backends.megatron import cpu_shim
from relax.backends.megatron.micro_batch import build, length_multiple

if TYPE_CHECKING:
    from relax.backends.megatron.rank import MegatronRank


def run(r: MegatronRank, micro: list[Rows], loss: LossFn | None, *, entropy: bool = False,
        entropy_grad: bool = False) -> list[Any]:
    """The last stage returns, per micro-batch, `loss(k, scores)` (its loss went backward) or the
    detached scores; the other stages an empty list."""
    from megatron.core.pipeline_parallel import get_forward_backward_func

    results: list[Any] = []

    def step(data_iterator: Any, model: Any):
        k = next(data_iterator)
        mb = build(r, micro[k], entropy=entropy, entropy_grad=entropy_grad)
        with mb:
            out = mb.call(model)

        def loss_func(out_BTK: torch.Tensor):
            scores = mb.outputs(out_BTK)
            if loss is None:
                scores.values_BT = scores.values_BT.detach()
                results.append(scores)
                return out_BTK.sum() * 0.0, 1, {}
            result = loss(k, scores)
            results.append(result)
            return result.loss, 1, {}  # already normalised by the step's tokens: no rescaling

        return out, loss_func

    # One activation shape for the whole schedule: every micro-batch padded to the largest.
    length, multiple = max(max(len(x) for x in rows.tokens) for rows in micro), length_multiple(r)
    r.pad_to = (max(len(rows.tokens) for rows in micro), -(-length // multiple) * multiple)
    try:
        with cpu_shim.cuda_to_cpu():
            get_forward_backward_func()(
                forward_step_func=step, data_iterator=iter(range(len(micro))), model=[r.model],
                num_microbatches=len(micro), seq_length=r.pad_to[1], micro_batch_size=r.pad_to[0],
                forward_only=loss is None)
    finally:
        r.pad_to = (0, 0)
    return results
