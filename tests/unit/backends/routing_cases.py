"""Engine rows for the routing replay tests of the training backends (fsdp, megatron EP=2).

The setup where engine and trainer route differently without R3, honestly: the `hf` engine serves a
tiny Qwen3-MoE in bfloat16 (as engines serve models) while the trainers compute in float32; bf16
rounding flips the experts of near-tie tokens. Weights are drawn with std 0.1 (Qwen3's 0.02 leaves a
random model's experts too small for routing to move a log-prob, `build_tiny_qwen3_moe`). A dense
Qwen3 of the same size and init, through the same bf16 engine, gives the level R3 should reach:
what is left is bf16-vs-float32 numerics, not routing."""

from __future__ import annotations

import asyncio
import os

import numpy as np
import torch

from relax.utils.routing import RoutingShape, decode_reply, to_bytes

SHAPE = RoutingShape(layers=2, top_k=2, num_experts=8)


def make_models(root: str) -> dict[str, str]:
    """A tiny Qwen3-MoE and a dense Qwen3 of its size (both init std 0.1), with one tokenizer."""
    from examples.tiny_math.task import tokenizer_corpus
    from relax.utils.tiny_model import build_tiny_qwen3, build_tiny_qwen3_moe, save_tiny_model, train_chatml_tokenizer

    tokenizer = train_chatml_tokenizer(tokenizer_corpus(), vocab_size=300)
    dense = build_tiny_qwen3(tokenizer, seed=1)
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        for p in dense.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.1)
    return {"moe": save_tiny_model(build_tiny_qwen3_moe(tokenizer, seed=1), tokenizer, os.path.join(root, "moe")),
            "dense": save_tiny_model(dense, tokenizer, os.path.join(root, "dense"))}


def engine_rows(model_dir: str, routed: bool, rows: int = 16, new_tokens: int = 24) -> dict:
    """Random prompts sampled by an in-process hf engine in bfloat16 (one continuous batch): tokens,
    response lengths, the engine's log-probs and (`routed`) its routing records as data-plane bytes."""
    from relax.backends.hf.engine import HFEngine
    from relax.backends.hf.protocol import GenerateRequest, build_output, normalize_generate

    g = torch.Generator().manual_seed(0)
    sizes = torch.randint(4, 24, (rows,), generator=g)
    prompts = [torch.randint(5, 290, (int(n),), generator=g).tolist() for n in sizes]

    async def run():
        engine = HFEngine(model_dir, seed=0, routed_experts=routed, dtype="bfloat16")
        await engine.start()
        try:
            req = GenerateRequest(input_ids=prompts, return_logprob=True, return_routed_experts=routed,
                                  sampling_params=[{"max_new_tokens": new_tokens, "ignore_eos": True,
                                                    "sampling_seed": i} for i in range(rows)])
            items, _ = normalize_generate(req, engine.tokenizer, vocab_size=engine.vocab_size,
                                          max_context_len=engine.max_context_len)
            results = await engine.generate(items)
            return results, [build_output(i, r, weight_version="0", e2e_latency=0.0) for i, r in zip(items, results)]
        finally:
            await engine.stop()

    results, replies = asyncio.run(run())
    return {"tokens": [p + r.output_ids for p, r in zip(prompts, results)],
            "lengths": [len(r.output_ids) for r in results], "logprobs": [r.output_logprobs for r in results],
            "routing": [to_bytes(decode_reply(o["meta_info"]["routed_experts"], SHAPE), SHAPE) for o in replies]
            if routed else None}


def float32_log_probs(model_dir: str, rows: dict) -> list[list[float]]:
    """The rows' response log-probs from a plain float32 HF forward, one row at a time: what a float32
    trainer computes (fsdp and megatron agree with it to ~1e-6, test_parity.py); the dense level."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for tokens, n in zip(rows["tokens"], rows["lengths"]):
            logp = torch.log_softmax(model(torch.tensor([tokens])).logits[0, -n - 1:-1].float(), -1)
            out.append(logp.gather(-1, torch.tensor(tokens[-n:])[:, None])[:, 0].tolist())
    return out


def mismatch(trainer: list[list[float]], engine: list[list[float]]) -> tuple[float, float]:
    """Per-token |trainer - engine| log-prob difference: (mean, max)."""
    diff = np.abs(np.concatenate([np.subtract(t, e) for t, e in zip(trainer, engine)]))
    return float(diff.mean()), float(diff.max())


def megatron_ranks(rank: int, world_size: int, port: int, model_dir: str, moe: dict, out: str) -> None:
    """One rank of a megatron group (spawned, gloo) on the MoE, expert parallel over every rank.
    Writes this rank's rows and its log-probs: free, with R3, with R2 (a second forward replaying
    what the first recorded), and the R3 training step's PPO KL and whether the router moved."""
    import json

    from relax.algorithms.policy_loss import PolicyLossConfig
    from relax.backends.base import ModelParallelSpec, TrainerSpec
    from relax.backends.trainer.trainer import Trainer
    from relax.config.schema import BatchConfig, OptimizerConfig
    from relax.types import TrainBatch

    w = Trainer(rank, world_size, "127.0.0.1", port, TrainerSpec(
        model_path=model_dir, backend="megatron", optim=OptimizerConfig(lr=1e-2), batch=BatchConfig(micro_batch_size=4),
        loss=PolicyLossConfig(), threads=1, routing_replay=True, model_parallel=ModelParallelSpec(ep=world_size)))
    info = w.parallel_info()
    idx = list(range(info["dp_rank"], len(moe["tokens"]), info["dp_size"]))
    m = {k: None if v is None else [v[i] for i in idx] for k, v in moe.items()}
    free = w.compute_log_probs(m["tokens"], m["lengths"])  # the policy's first forward: records (R2)
    again = w.compute_log_probs(m["tokens"], m["lengths"])  # replays that record
    w.forget_routing()
    replayed = w.compute_log_probs(m["tokens"], m["lengths"], routing=m["routing"])
    gate = next(p for n, p in w.runner.model.named_parameters() if n.endswith("mlp.router.weight"))
    before = gate.detach().clone()
    batch = TrainBatch(tokens_RL=m["tokens"], response_lengths_R=m["lengths"],
                       loss_masks_RT=[[1] * n for n in m["lengths"]], old_log_probs_RT=replayed,
                       advantages_RT=[[(-1.0) ** i] * n for i, n in enumerate(m["lengths"])],
                       rollout_log_probs_RT=m["logprobs"], rollout_routed_experts_RB=m["routing"])
    metrics = w.train(batch, 1, [sum(moe["lengths"])])
    result = {"rows": idx, "free": free, "again": again, "replayed": replayed, "ppo_kl": metrics["ppo_kl"],
              "router_moved": not torch.equal(before, gate.detach()), "ep": w.runner.r.ep_size}
    w.shutdown()
    with open(f"{out}.{rank}.json", "w") as f:
        json.dump(result, f)
