"""The backend-agnostic training wing: one `Trainer` per rank holding a backend's `ModelRunner`.

    trainer.py     the rank (a Ray actor): scoring and training passes, the optimizer step,
                   offload, weights in and out, checkpoints, all through the runner
    passes.py      a pass's micro-batch plan (dynamic batching, lockstep between ranks whose
                   forwards communicate) and the streamed pass's bookkeeping
    losses.py      a micro-batch's policy or value loss from its forward's scores
    optim.py       the optimizer, its LR schedule and the step's metric reductions
    host_optimizer.py  --optimizer-cpu-offload: the optimizer's state and step on the host
    lowp_adam.py   --use-precision-aware-optimizer: AdamW with bfloat16 moments
    weights_out.py rank 0's weight push to every receiver lane (engines, ActorFwd, Reference)
    runner_kit.py  what runners share: the one-stage schedule, parameter freezing
    group.py       `TrainerGroup`, the typed facade the components use over a role's ranks
"""
