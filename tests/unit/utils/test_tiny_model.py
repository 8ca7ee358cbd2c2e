"""Tiny ChatML tokenizer and tiny Qwen3: round-trips, chat template, save/load."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from relax.utils.tiny_model import (  # noqa: E402
    IM_END,
    IM_START,
    PAD_TOKEN,
    build_tiny_qwen3,
    count_parameters,
    save_tiny_model,
    train_chatml_tokenizer,
)

CORPUS = ["Find the largest number: 3, 8, 1. Put the final answer in \\boxed{}.", "The largest is \\boxed{8}."] * 20


@pytest.fixture(scope="module")
def tokenizer():
    return train_chatml_tokenizer(CORPUS, vocab_size=320)


def test_tokenizer_special_tokens_are_pad_eos_and_im_start(tokenizer):
    assert tokenizer.pad_token == PAD_TOKEN
    assert tokenizer.eos_token == IM_END
    ids = tokenizer(f"{IM_START}user\nhi{IM_END}", add_special_tokens=False)["input_ids"]
    assert ids[0] == tokenizer.convert_tokens_to_ids(IM_START)
    assert ids[-1] == tokenizer.eos_token_id
    assert len({tokenizer.pad_token_id, tokenizer.eos_token_id, ids[0]}) == 3


@pytest.mark.parametrize(
    "text", ["The largest is \\boxed{8}.", "héllo  wörld ✓\n\t12345, 6", "unseen words: zebra!"]
)
def test_decode_skipping_special_tokens_round_trips_text(tokenizer, text):
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids, skip_special_tokens=True) == text


def test_digits_are_split_into_single_tokens(tokenizer):
    tokens = tokenizer.convert_ids_to_tokens(tokenizer("12345", add_special_tokens=False)["input_ids"])
    assert tokens == ["1", "2", "3", "4", "5"]


def test_chat_template_is_qwen_chatml_with_generation_prompt(tokenizer):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n"
    )
    no_gen = tokenizer.apply_chat_template(messages[1:], tokenize=False, add_generation_prompt=False)
    assert no_gen == "<|im_start|>user\n2+2?<|im_end|>\n"


def test_too_small_vocab_is_rejected():
    with pytest.raises(ValueError, match="vocab_size"):
        train_chatml_tokenizer(CORPUS, vocab_size=100)


def test_same_seed_builds_identical_weights_and_sets_special_ids(tokenizer):
    a = build_tiny_qwen3(tokenizer, hidden_size=32, num_layers=1, num_heads=2, seed=3)
    b = build_tiny_qwen3(tokenizer, hidden_size=32, num_layers=1, num_heads=2, seed=3)
    c = build_tiny_qwen3(tokenizer, hidden_size=32, num_layers=1, num_heads=2, seed=4)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert not torch.equal(a.model.embed_tokens.weight, c.model.embed_tokens.weight)
    assert a.config.vocab_size == len(tokenizer)
    assert a.config.pad_token_id == tokenizer.pad_token_id
    assert a.config.eos_token_id == tokenizer.eos_token_id
    assert a.config.tie_word_embeddings
    assert a.config.max_position_embeddings == 256
    assert count_parameters(a) < 100_000


def test_bad_head_count_is_rejected(tokenizer):
    with pytest.raises(ValueError, match="num_heads"):
        build_tiny_qwen3(tokenizer, hidden_size=30, num_heads=4)


def test_saved_checkpoint_loads_with_auto_classes_and_same_outputs(tokenizer, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    model = build_tiny_qwen3(tokenizer, hidden_size=32, num_layers=1, num_heads=2, seed=0).eval()
    save_tiny_model(model, tokenizer, str(tmp_path))
    assert (tmp_path / "model.safetensors").exists()
    loaded = AutoModelForCausalLM.from_pretrained(str(tmp_path)).eval()
    loaded_tok = AutoTokenizer.from_pretrained(str(tmp_path))
    gen = GenerationConfig.from_pretrained(str(tmp_path))
    assert gen.eos_token_id == tokenizer.eos_token_id
    assert loaded_tok.eos_token_id == tokenizer.eos_token_id and loaded_tok.pad_token_id == tokenizer.pad_token_id
    messages = [{"role": "user", "content": "Find the largest number: 1, 2."}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert loaded_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == text
    ids = torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        assert torch.allclose(model(ids).logits, loaded(ids).logits)
