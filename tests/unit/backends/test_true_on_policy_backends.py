"""--true-on-policy-mode across the CPU backends: the hf engine's reported log-probs equal the fsdp
trainer's recomputed ones bitwise, and the first optimizer step sees a mismatch of exactly 0."""

from __future__ import annotations

import asyncio

import pytest
import torch

from relax.algorithms.policy_loss import PolicyLossConfig
from relax.backends.base import TrainerSpec
from relax.config.schema import BatchConfig, OptimizerConfig
from relax.distributed.ray.actor_group import free_port
from relax.types import TrainBatch

TEMPERATURE = 0.7
# Rows of different prompt and response lengths. The last one keeps EOS live with min_new_tokens:
# the engine masks EOS in its decoding logits for those steps, which the trainer knows nothing of.
PROMPTS = [list(range(5, 12)), [40, 41], list(range(60, 72)), [12, 13, 14, 15], [3]]
REQUESTS = [dict(max_new_tokens=9, ignore_eos=True), dict(max_new_tokens=3, ignore_eos=True),
            dict(max_new_tokens=14, ignore_eos=True), dict(max_new_tokens=6, ignore_eos=True),
            dict(max_new_tokens=8, min_new_tokens=8)]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from examples.tiny_math.task import tokenizer_corpus
    from relax.utils.tiny_model import build_tiny_qwen3, save_tiny_model, train_chatml_tokenizer

    tokenizer = train_chatml_tokenizer(tokenizer_corpus(), vocab_size=300)
    return save_tiny_model(build_tiny_qwen3(tokenizer), tokenizer, str(tmp_path_factory.mktemp("top") / "model"))


@pytest.fixture(scope="module")
def worker(model_dir):
    from relax.backends.trainer.trainer import Trainer

    # micro_batch_size 4: without the mode, rows are scored in padded batches.
    spec = TrainerSpec(model_path=model_dir, optim=OptimizerConfig(lr=1e-3), batch=BatchConfig(micro_batch_size=4),
                       loss=PolicyLossConfig(), temperature=TEMPERATURE, threads=1, true_on_policy=True)
    w = Trainer(0, 1, "127.0.0.1", free_port(), spec)
    yield w
    w.shutdown()


def generate(model_dir: str, target: str | None):
    """The prompts through an in-process HFEngine (one continuous batch): the result rows."""
    from relax.backends.hf.engine import HFEngine
    from relax.backends.hf.protocol import GenerateItem
    from relax.backends.hf.sampling import parse_sampling_params

    async def run():
        engine = HFEngine(model_dir, rl_on_policy_target=target, seed=0)
        await engine.start()
        try:
            return await engine.generate([
                GenerateItem(f"r{i}", p, parse_sampling_params(dict(temperature=TEMPERATURE, sampling_seed=i, **req)),
                             True)
                for i, (p, req) in enumerate(zip(PROMPTS, REQUESTS))])
        finally:
            await engine.stop()

    return asyncio.run(run())


def as_batch(results) -> TrainBatch:
    lengths = [len(r.output_ids) for r in results]
    return TrainBatch(tokens_RL=[p + r.output_ids for p, r in zip(PROMPTS, results)], response_lengths_R=lengths,
                      loss_masks_RT=[[1] * n for n in lengths],
                      advantages_RT=[[(-1.0) ** i] * n for i, n in enumerate(lengths)],
                      rollout_log_probs_RT=[r.output_logprobs for r in results])


def test_engine_log_probs_equal_trainer_log_probs_bitwise(model_dir, worker):
    torch.set_num_threads(1)  # the engine runs in this process: the trainer's thread count
    results = generate(model_dir, "fsdp")
    assert len({len(r.output_ids) for r in results}) >= 4  # rows of different lengths
    batch = as_batch(results)
    trainer = worker.compute_log_probs(batch.tokens_RL, batch.response_lengths_R)
    assert trainer == batch.rollout_log_probs_RT  # float equality, token by token


def test_true_on_policy_leaves_sampled_tokens_unchanged(model_dir):
    torch.set_num_threads(1)
    plain, exact = generate(model_dir, None), generate(model_dir, "fsdp")
    assert [r.output_ids for r in plain] == [r.output_ids for r in exact]
    # Without the mode the engine reports its decoding log-probs: close (not guaranteed equal) ...
    for a, b in zip(plain[:-1], exact[:-1]):
        assert a.output_logprobs == pytest.approx(b.output_logprobs, abs=1e-4)
    # ... except where min_new_tokens masked EOS: log p renormalised without EOS, visibly higher.
    assert min(a - b for a, b in zip(plain[-1].output_logprobs, exact[-1].output_logprobs)) > 1e-4


def test_a_scoring_request_gives_the_trainers_log_probs_wherever_the_response_starts(model_dir, worker):
    """Input-token log-probs of a zero-budget request (how a multi-turn rollout rescores a finished
    trajectory): the trainer's one-row function at the request's temperature, so every suffix equals
    the trainer's score of that suffix as the response. Runs before the optimizer step below moves the
    module's worker away from the saved weights."""
    from relax.backends.hf.engine import HFEngine
    from relax.backends.hf.protocol import GenerateItem
    from relax.backends.hf.sampling import parse_sampling_params

    torch.set_num_threads(1)
    tokens = PROMPTS[2] + [7, 8, 9, 10, 11, 12]

    async def run():
        engine = HFEngine(model_dir, rl_on_policy_target="fsdp", seed=0)
        await engine.start()
        try:
            params = parse_sampling_params({"temperature": TEMPERATURE, "max_new_tokens": 0})
            return (await engine.generate([GenerateItem("s", tokens, params, True, logprob_start_len=1)]))[0]
        finally:
            await engine.stop()

    scored = asyncio.run(run()).input_logprobs
    for start in (3, 12):
        assert scored[start:] == worker.compute_log_probs([tokens], [len(tokens) - start])[0]


def test_first_step_sees_zero_mismatch_and_unit_ratio(model_dir, worker):
    torch.set_num_threads(1)
    batch = as_batch(generate(model_dir, "fsdp"))
    batch.old_log_probs_RT = worker.compute_log_probs(batch.tokens_RL, batch.response_lengths_R)
    metrics = worker.train(batch, 1, [sum(batch.response_lengths_R)])
    assert metrics["train_rollout_logprob_abs_diff_max"] == 0.0
    assert metrics["train_rollout_importance_ratio_min"] == metrics["train_rollout_importance_ratio_max"] == 1.0
    assert metrics["ppo_kl"] == 0.0 and metrics["pg_clipfrac"] == 0.0
    assert metrics["grad_norm"] > 0


def test_penalties_are_refused_in_true_on_policy_mode(model_dir):
    """The trainer cannot reproduce a penalised distribution: a penalty or bias is a clear error."""
    from relax.backends.hf.engine import HFEngine
    from relax.backends.hf.protocol import GenerateItem
    from relax.backends.hf.sampling import parse_sampling_params

    async def run():
        engine = HFEngine(model_dir, rl_on_policy_target="fsdp", seed=0)
        await engine.start()
        try:
            await engine.generate([GenerateItem("r", PROMPTS[0], parse_sampling_params({"repetition_penalty": 1.1}),
                                                True)])
        finally:
            await engine.stop()

    with pytest.raises(ValueError, match="cannot reproduce"):
        asyncio.run(run())

