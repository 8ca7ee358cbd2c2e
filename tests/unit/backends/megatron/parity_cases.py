"""Run training-backend ranks on tiny models and report what they computed (for test_parity.py).

`run(rank, world_size, ports, cases, out)` runs each case in turn in this process (case i's
group on `ports[i]`, `relax.utils.net.free_ports`): build the
worker, score a fixed batch, train one optimizer step on it, score again, gather the HF-named
weights, save a checkpoint (megatron: `<out>-ckpt<i>`), shut down. A case is
(backend, model, model_parallel kwargs); `bf16`: bf16 compute over float32 main weights
(`run_on_gpu`: on one GPU per rank). The fixed batch is split over data-parallel shards as
the Actor splits it (`relax.components.training.step_plan`)."""

from __future__ import annotations

import contextlib
import dataclasses

import json
import os
import time

import torch

from relax.algorithms.policy_loss import PolicyLossConfig
from relax.backends.base import ModelParallelSpec, TrainerSpec
from relax.components.training import step_plan
from relax.config.schema import BatchConfig, OptimizerConfig
from relax.types import TrainBatch


OPTIMIZER_FLAGS = {f.name for f in dataclasses.fields(OptimizerConfig)}


def make_models(root: str) -> dict[str, str]:
    from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

    paths = {"dense": os.path.join(root, "dense"), "moe": os.path.join(root, "moe")}
    torch.manual_seed(0)
    # An odd vocabulary: megatron pads it (to 128 x TP rows), and every layout must match fsdp on it.
    Qwen3ForCausalLM(Qwen3Config(vocab_size=67, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2, head_dim=8, pad_token_id=0,
                                 tie_word_embeddings=True)).save_pretrained(paths["dense"])
    Qwen3MoeForCausalLM(Qwen3MoeConfig(vocab_size=64, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
                                       num_experts=4, num_experts_per_tok=2, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, head_dim=8, pad_token_id=0,
                                       tie_word_embeddings=False, norm_topk_prob=True)).save_pretrained(paths["moe"])
    return paths


def batch() -> TrainBatch:
    g = torch.Generator().manual_seed(3)
    tokens = [torch.randint(1, 64, (n,), generator=g).tolist() for n in (7, 5, 9, 6, 8, 5, 7, 9)]
    lengths = [3, 2, 4, 2, 3, 2, 4, 5]
    adv = [[(-1.0) ** i * 0.5 * (1 + j)] * n for i, (n, j) in enumerate(zip(lengths, range(8)))]
    return TrainBatch(tokens_RL=tokens, response_lengths_R=lengths, loss_masks_RT=[[1] * n for n in lengths],
                      advantages_RT=adv)


def run(rank: int, world_size: int, ports: list[int], cases: list, out: str, bf16: bool = False) -> None:
    from relax.backends.trainer.trainer import Trainer

    results = []
    for i, (backend, model_path, parallel) in enumerate(cases):
        # A case's optimizer flags (--optimizer-cpu-offload, --overlap-grad-reduce, ...) beside its layout.
        # adam_eps 1e-6: Adam's first step moves a weight by lr * g / (|g| + eps), which for a gradient
        # element near eps amplifies float32 rounding (a tensor-parallel partial sum, ~1e-9) by lr / eps;
        # at the default 1e-8 one such element of the odd-vocabulary model differed by 1.6e-4 at TP=2.
        parallel = dict(parallel)
        # each decoder layer compiled: True = dynamo's "eager" backend (CPU), or a backend's name ("inductor")
        compiled = parallel.pop("compiled", False)
        flags = {k: v for k, v in parallel.items() if k in OPTIMIZER_FLAGS}
        optim = OptimizerConfig(lr=1e-2, clip_grad=1.0, bf16=bf16, adam_eps=1e-6, **flags)
        spec = TrainerSpec(model_path=model_path, optim=optim,
                           batch=BatchConfig(micro_batch_size=2), loss=PolicyLossConfig(), threads=1,
                           model_parallel=ModelParallelSpec(**{k: v for k, v in parallel.items() if k not in flags}))
        worker = Trainer(rank, world_size, "127.0.0.1", ports[i], dataclasses.replace(spec, backend=backend))
        info = worker.parallel_info()
        if compiled:
            from torch._dynamo.utils import counters

            from relax.backends.megatron import compile_shim

            torch._dynamo.reset()  # this case's layers compile afresh, within dynamo's recompile limit
            counters.clear()
            compile_shim.compile_layers(worker.runner.model.decoder.layers,
                                        backend="eager" if compiled is True else compiled)
        b = batch()
        _, shards, tokens = step_plan(b.loss_masks_RT, len(b), info["dp_size"])
        mine = b.rows(shards[info["dp_rank"]])
        # A compiled case fails past the recompile limit, where its layers would run uncompiled; the setting
        # is this case's only (the session's rank processes run other tests after it).
        strict = torch._dynamo.config.patch(fail_on_recompile_limit_hit=True) if compiled else contextlib.nullcontext()
        with strict:
            before = worker.compute_log_probs(mine.tokens_RL, mine.response_lengths_R)
            mine.old_log_probs_RT = before
            metrics = worker.train(mine, 1, tokens)
            after = worker.compute_log_probs(mine.tokens_RL, mine.response_lengths_R)
        acted = flag_effects(worker)
        hf = {name: t.float().tolist() for name, t, _ in worker.runner.hf_state()}
        if backend == "megatron":  # scripts/tools/convert_megatron_to_hf.py reads it back
            worker.save(f"{out}-ckpt{i}", 0)
        worker.shutdown()
        results.append({"info": info, "rows": shards[info["dp_rank"]], "before": before, "after": after,
                        "metrics": {k: v for k, v in metrics.items() if isinstance(v, float)},
                        "hf": hf if rank == 0 else {}, "acted": acted,
                        "graph_breaks": sum(counters["graph_break"].values()) if compiled else None,
                        "graphs": counters["stats"]["unique_graphs"] if compiled else None})
    with open(f"{out}.{rank}.json", "w") as f:
        json.dump(results, f)


def flag_effects(worker) -> dict:
    """What the optimizer flags did on this rank: a host optimizer (--optimizer-cpu-offload), the
    gradient buckets launched during backward of all (--overlap-grad-reduce), the weight broadcasts
    the last step left to the next forward (--overlap-param-gather); megatron: whether its
    micro-batches were packed (--qkv-format thd), the forwards of a --custom-model-provider-path model."""
    from relax.backends.trainer.host_optimizer import host_optimizers

    overlap, gather = getattr(worker.runner, "grad_overlap", None), getattr(worker.runner, "param_gather", None)
    rank = getattr(worker.runner, "r", None)
    return {"host_optimizer": bool(host_optimizers(worker.optimizer)),
            "grad_buckets": list(overlap.last_step) if overlap else None,
            "param_broadcasts": gather.last_launch if gather else None,
            "packed": rank.packed if rank is not None else None,
            "provided_forwards": getattr(worker.runner.model, "provided_forwards", None)}


def wrapping_provider(pre_process: bool, post_process: bool, default_provider, vp_stage=None):
    """A --custom-model-provider-path provider that wraps the default one: the backend's own model,
    counting its forwards (`provided_forwards`)."""
    model = default_provider(pre_process=pre_process, post_process=post_process)
    model.provided_forwards = 0

    def count(module, args):
        module.provided_forwards += 1

    model.register_forward_pre_hook(count)
    return model


def run_on_gpu(rank: int, world_size: int, ports: list[int], cases: list, out: str) -> None:
    """`run` in bf16 on GPU `rank` (each rank a process that sees one GPU, as Ray gives each
    trainer rank; NCCL between them)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")  # the parent's list, if it narrowed the GPUs
    os.environ["CUDA_VISIBLE_DEVICES"] = visible.split(",")[rank] if visible else str(rank)
    run(rank, world_size, ports, cases, out, bf16=True)


def serve_receiver(rank: int, world_size: int, ports: list[int], cases: list, address: str, authkey: bytes) -> None:
    """A megatron scoring rank (as ActorFwd's) per case (model path, model_parallel kwargs), in turn,
    answering the test over a connection to `address` (its rank first): ("call", path, payload) ->
    `receive_weights`' reply, ("score",) -> (parallel_info, log-probs of `batch()`), ("next",) ->
    shut down, start the next case."""
    from multiprocessing.connection import Client

    from relax.backends.trainer.trainer import Trainer

    conn = Client(address, authkey=authkey)
    conn.send(rank)

    for i, (model_path, parallel) in enumerate(cases):
        spec = TrainerSpec(backend="megatron", model_path=model_path, trainable=False, optim=OptimizerConfig(),
                           threads=1, batch=BatchConfig(micro_batch_size=4),
                           model_parallel=ModelParallelSpec(**parallel), sync_timeout_s=60)
        worker = Trainer(rank, world_size, "127.0.0.1", ports[i], spec)
        b = batch()
        while (msg := conn.recv())[0] != "next":
            if msg[0] == "score":
                conn.send((worker.parallel_info(), worker.compute_log_probs(b.tokens_RL, b.response_lengths_R)))
            else:
                conn.send(worker.receive_weights(msg[1], msg[2]))
        worker.shutdown()
    conn.close()


def join_ranks(procs: list, timeout: float, what: str) -> None:
    """Wait for rank processes; as soon as one fails (or the time is up) stop the others (a rank
    left waiting for a failed peer would hang pytest's exit) and fail with every exit code."""
    deadline = time.monotonic() + timeout
    try:
        while any(p.is_alive() for p in procs) and time.monotonic() < deadline:
            if any(p.exitcode not in (None, 0) for p in procs):
                break
            time.sleep(0.2)
        codes = [p.exitcode for p in procs]
        assert codes == [0] * len(procs), f"{what}: rank exit codes {codes} (None: hung, stopped); output above"
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(5)
