"""LoRA on the fsdp runner, one Trainer rank in-process (gloo): only the adapters train and hold
optimizer state, the Reference is the base model with the adapter off, a push carries the adapter
tensors only, a resumed run equals an uninterrupted one bitwise, and the HF export is the merged model
plus the adapter in peft's format."""

from __future__ import annotations

import pytest
import torch

from relax.algorithms.policy_loss import PolicyLossConfig
from relax.backends.base import TrainerSpec
from relax.backends.fsdp.checkpoint import check_lora_meta
from relax.config.lora import LoraSpec
from relax.config.schema import BatchConfig, OptimizerConfig
from relax.distributed.ray.actor_group import free_port
from relax.types import TrainBatch
from relax.utils.peft_files import is_adapter_name, load_adapter

# Dropout on: the resume test then also checks that the RNG state comes back with the adapters.
SPEC = LoraSpec(rank=4, alpha=8.0, targets=("q_proj", "v_proj", "down_proj"), dropout=0.1)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    path = tmp_path_factory.mktemp("m")
    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, pad_token_id=0)
    Qwen3ForCausalLM(cfg).save_pretrained(path)
    return path


def trainer(model_dir, lora: LoraSpec | None = SPEC):
    from relax.backends.trainer.trainer import Trainer

    spec = TrainerSpec(model_path=str(model_dir), optim=OptimizerConfig(lr=1e-2), batch=BatchConfig(micro_batch_size=2),
                       loss=PolicyLossConfig(), threads=1, lora=lora, total_steps=4)
    return Trainer(0, 1, "127.0.0.1", free_port(), spec)


def batch(shift: int = 0) -> TrainBatch:
    tokens = [[1, 2, 3, 4 + shift, 5], [1, 2, 6, 7], [3, 4, 5, 6, 7 + shift, 8], [2, 3, 9, 10]]
    lengths = [2, 2, 3, 2]
    return TrainBatch(tokens_RL=tokens, response_lengths_R=lengths, loss_masks_RT=[[1] * n for n in lengths],
                      advantages_RT=[[1.0] * 2, [-1.0] * 2, [0.5] * 3, [-0.5] * 2])


def train_step(w, shift: int) -> dict[str, float]:
    b = batch(shift)
    b.old_log_probs_RT = w.compute_log_probs(b.tokens_RL, b.response_lengths_R)
    return w.train(b, 1, [9])


def adapters(w) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in w.runner.model.named_parameters() if is_adapter_name(n)}


def test_only_the_adapters_train_and_hold_optimizer_state(model_dir):
    w = trainer(model_dir)
    try:
        model = w.runner.model
        base = {n: p.detach().clone() for n, p in model.named_parameters() if not is_adapter_name(n)}
        before = adapters(w)
        assert len(before) == 2 * 3 * 2  # lora_A and lora_B of q_proj, v_proj, down_proj in 2 layers
        train_step(w, 0)
        assert all(torch.equal(p, base[n]) for n, p in model.named_parameters() if n in base)  # base frozen
        after = adapters(w)
        assert all(not torch.equal(after[n], before[n]) for n in after if ".lora_B." in n)  # B left zero
        trained = {id(p) for p in w.runner.optimized_parameters()}
        assert trained == {id(p) for n, p in model.named_parameters() if is_adapter_name(n)}
        assert {id(p) for p in w.optimizer.state} == trained  # Adam moments for the adapters only
        pushed = [name for name, _, _ in w.runner.hf_state(None)]
        assert sorted(pushed) == sorted(after) and pushed  # the push carries the adapter tensors only
    finally:
        w.shutdown()


def test_reference_is_the_base_model_with_the_adapter_off(model_dir):
    from transformers import AutoModelForCausalLM

    w = trainer(model_dir)
    try:
        train_step(w, 0)
        b = batch()
        on = w.compute_log_probs(b.tokens_RL, b.response_lengths_R)
        ref = w.compute_log_probs(b.tokens_RL, b.response_lengths_R, base=True)
        plain = AutoModelForCausalLM.from_pretrained(model_dir).eval()
        for toks, n, lp, lp_on in zip(b.tokens_RL, b.response_lengths_R, ref, on):
            with torch.no_grad():
                logits = plain(input_ids=torch.tensor([toks])).logits[0, :-1]
            want = torch.log_softmax(logits.float(), -1)[torch.arange(len(toks) - n - 1, len(toks) - 1),
                                                         torch.tensor(toks[-n:])]
            assert torch.allclose(torch.tensor(lp), want, atol=1e-5)
            assert not torch.allclose(torch.tensor(lp_on), want, atol=1e-5)  # the adapter is on otherwise
    finally:
        w.shutdown()


def test_resume_with_adapters_equals_an_uninterrupted_run(model_dir, tmp_path):
    """4 optimizer steps in one go == 2 steps, save (adapters, optimizer, RNG), a fresh rank loads and
    runs the last 2: every adapter tensor and metric bitwise equal (dropout draws included)."""
    w = trainer(model_dir)
    try:
        whole = [train_step(w, s) for s in range(4)]
        final = adapters(w)
    finally:
        w.shutdown()
    w = trainer(model_dir)
    try:
        first = [train_step(w, s) for s in range(2)]
        w.save(str(tmp_path / "ckpt"), rollout_id=1)
    finally:
        w.shutdown()
    saved = {p.name for p in (tmp_path / "ckpt" / "model").iterdir()}
    w = trainer(model_dir)
    try:
        meta = w.load(str(tmp_path / "ckpt"))
        assert meta["lora"] == SPEC.as_dict() and w.step == 2
        rest = [train_step(w, s) for s in range(2, 4)]
        resumed = adapters(w)
    finally:
        w.shutdown()
    for m in whole + first + rest:
        m.pop("compute_seconds")
    assert first + rest == whole
    assert all(torch.equal(resumed[n], final[n]) for n in final)
    assert saved  # DCP shards of the adapters and their optimizer state


def test_export_writes_the_merged_model_and_the_peft_adapter(model_dir, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast
    from tokenizers import Tokenizer, models

    tok_dir = tmp_path / "tok"
    PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({"a": 0, "<unk>": 1}, unk_token="<unk>"))
                            ).save_pretrained(tok_dir)
    for f in model_dir.iterdir():
        (tok_dir / f.name).write_bytes(f.read_bytes())
    w = trainer(tok_dir)
    try:
        train_step(w, 0)
        b = batch()
        want = w.compute_log_probs(b.tokens_RL, b.response_lengths_R)
        w.export_hf(str(tmp_path / "hf"), str(tok_dir))
        trained = adapters(w)
    finally:
        w.shutdown()
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert not any(is_adapter_name(n) for n in merged.state_dict())
    for toks, n, lp in zip(b.tokens_RL, b.response_lengths_R, want):
        with torch.no_grad():
            logits = merged(input_ids=torch.tensor([toks])).logits[0, :-1]
        got = torch.log_softmax(logits.float(), -1)[torch.arange(len(toks) - n - 1, len(toks) - 1),
                                                    torch.tensor(toks[-n:])]
        assert torch.allclose(got, torch.tensor(lp), atol=1e-5)
    config, tensors = load_adapter(tmp_path / "hf" / "adapter")
    assert config["r"] == 4 and config["lora_alpha"] == 8.0 and config["target_modules"] == list(SPEC.targets)
    assert set(tensors) == set(trained) and all(torch.equal(tensors[n], trained[n]) for n in tensors)


class _Runner:
    def __init__(self, lora):
        self.spec = TrainerSpec(model_path="m", lora=lora)


def test_resume_refuses_a_checkpoint_of_other_lora_flags():
    check_lora_meta(_Runner(SPEC), {"lora": SPEC.as_dict()})
    check_lora_meta(_Runner(None), {})
    with pytest.raises(ValueError, match="holds a full model .* --lora-rank 4"):
        check_lora_meta(_Runner(SPEC), {})
    with pytest.raises(ValueError, match="holds LoRA adapters but this run has --lora-rank 0"):
        check_lora_meta(_Runner(None), {"lora": SPEC.as_dict()})
    with pytest.raises(ValueError, match="same LoRA flags"):
        check_lora_meta(_Runner(LoraSpec(8, 8.0)), {"lora": SPEC.as_dict()})
