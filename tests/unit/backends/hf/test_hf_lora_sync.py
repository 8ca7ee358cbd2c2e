"""LoRA weight sync end to end: a LoRA fsdp Trainer rank in this process pushes its adapter over gloo to
a live hf engine started with --enable-lora. The push carries the adapter tensors only (its bytes are
the adapter's), and after each push the engine's log-probs are the trainer's: the base weights stay
as loaded, so a second push replaces the first adapter instead of adding to it."""

from __future__ import annotations

import asyncio

import pytest

from relax.algorithms.policy_loss import PolicyLossConfig
from relax.backends.base import TrainerSpec
from relax.backends.hf.launcher import launch_hf_engine
from relax.config.lora import LoraSpec, engine_lora_options
from relax.config.schema import BatchConfig, OptimizerConfig, RelaxConfig
from relax.distributed.engine_client import EngineClient
from relax.distributed.ray.actor_group import free_port
from relax.types import TrainBatch
from relax.utils.peft_files import is_adapter_name

API_KEY = "lora-key"
SPEC = LoraSpec(rank=4, alpha=8.0, targets=("q_proj", "v_proj", "gate_proj"))
PROMPT = [5, 6, 7, 8]


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    cfg = RelaxConfig().replace(lora_rank=4, lora_alpha=8, lora_target_modules="q_proj,v_proj,gate_proj")
    options = engine_lora_options(cfg, alpha=True)  # what the rollout launches its engines with
    process = launch_hf_engine(str(tiny_model_dir), api_key=API_KEY, options=options)
    try:
        yield process.wait_ready(timeout=120)
    finally:
        process.terminate()


@pytest.fixture(scope="module")
def rank(tiny_model_dir):
    from relax.backends.trainer.trainer import Trainer

    spec = TrainerSpec(model_path=str(tiny_model_dir), optim=OptimizerConfig(lr=5e-2),
                       batch=BatchConfig(micro_batch_size=4), loss=PolicyLossConfig(), threads=1, lora=SPEC)
    w = Trainer(0, 1, "127.0.0.1", free_port(), spec)
    yield w
    w.shutdown()


def train(w, sign: float) -> None:
    tokens = [PROMPT + [9, 10, 11], PROMPT + [12, 13, 14]]
    b = TrainBatch(tokens_RL=tokens, response_lengths_R=[3, 3], loss_masks_RT=[[1] * 3] * 2,
                   advantages_RT=[[sign] * 3, [-sign] * 3])
    b.old_log_probs_RT = w.compute_log_probs(b.tokens_RL, b.response_lengths_R)
    w.train(b, 1, [6])


def engine_log_probs(url: str) -> tuple[list[int], list[float]]:
    async def go():
        async with EngineClient(url, API_KEY) as client:
            return await client.generate({"input_ids": PROMPT, "return_logprob": True, "sampling_params": {
                "temperature": 0, "max_new_tokens": 6, "ignore_eos": True}})

    out = asyncio.run(go())
    return out["output_ids"], [lp for lp, _, _ in out["meta_info"]["output_token_logprobs"]]


def trainer_log_probs(w, ids: list[int], base: bool = False) -> list[float]:
    return w.compute_log_probs([PROMPT + ids], [len(ids)], base=base)[0]


def test_pushes_carry_the_adapter_only_and_replace_it(engine, rank):
    adapter_bytes = sum(p.numel() * p.element_size() for n, p in rank.runner.model.named_parameters()
                        if is_adapter_name(n))
    ids, base_lps = engine_log_probs(engine.url)
    assert base_lps == pytest.approx(trainer_log_probs(rank, ids, base=True), abs=1e-5)  # adapters start at 0
    assert rank.connect_receivers([engine.url], API_KEY, pause_mode="abort") == "gloo"
    for version, sign in ((1, 1.0), (2, -1.0)):
        train(rank, sign)
        metrics = rank.push_weights(version)
        assert metrics["weight_sync/bytes"] == adapter_bytes  # lora_A / lora_B of 3 modules x 2 layers
        assert adapter_bytes < sum(p.numel() * 4 for p in rank.runner.model.parameters()) / 10
        ids, lps = engine_log_probs(engine.url)
        want = trainer_log_probs(rank, ids)
        assert lps == pytest.approx(want, abs=1e-5), version  # W0 + (alpha/r) B A, the latest adapter only
        assert max(abs(a - b) for a, b in zip(want, trainer_log_probs(rank, ids, base=True))) > 1e-3
    info = asyncio.run(EngineClient(engine.url).get_server_info())
    assert info["enable_lora"] is True and info["max_lora_rank"] == 4 and info["weight_version"] == "2"


def test_server_lora_flags_name_what_is_missing():
    from relax.backends.hf.server import lora_from_args, parse_args

    assert lora_from_args(parse_args(["--model-path", "m"])) is None
    args = parse_args(["--model-path", "m", "--enable-lora", "--max-lora-rank", "8", "--lora-target-modules", "q_proj",
                       "v_proj"])
    assert lora_from_args(args) == LoraSpec(8, 8.0, ("q_proj", "v_proj"))  # alpha defaults to the rank
    with pytest.raises(ValueError, match="--enable-lora needs --max-lora-rank"):
        lora_from_args(parse_args(["--model-path", "m", "--enable-lora"]))
