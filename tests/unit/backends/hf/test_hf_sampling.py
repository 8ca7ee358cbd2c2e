"""Sampling parameters and the token sampler of the hf engine."""

from __future__ import annotations

import math

import pytest
import torch

from relax.backends.hf.sampling import (
    SamplingBatch, apply_penalties, filter_probs, parse_sampling_params, sample_next_tokens,
)


def _batch(params: list[dict]) -> SamplingBatch:
    parsed = [parse_sampling_params(p) for p in params]
    return SamplingBatch.build(parsed, torch.device("cpu"))


def test_defaults_follow_sglang():
    p = parse_sampling_params(None)
    assert (p.temperature, p.top_p, p.top_k, p.max_new_tokens, p.skip_special_tokens) == (1.0, 1.0, -1, 128, True)
    assert parse_sampling_params({"stop": "x"}).stop == ("x",)


@pytest.mark.parametrize("params, needle", [
    ({"foo": 1}, "unknown sampling_params keys ['foo']"),
    ({"top_k": 0}, "top_k"),
    ({"top_p": 0}, "top_p"),
    ({"temperature": -1}, "temperature"),
    ({"max_new_tokens": 2, "min_new_tokens": 3}, "min_new_tokens"),
    ({"n": 0}, "sampling_params.n must be in [1, 256]"),
    ({"custom_params": {"a": 1}}, "custom_params={'a': 1} is not supported"),
    ({"regex": "a+", "json_schema": "{}"}, "give at most one of regex, json_schema, ebnf, structural_tag"),
    ({"ebnf": 3}, "sampling_params.ebnf must be a non-empty string"),
    ({"repetition_penalty": 0}, "repetition_penalty must be in (0, 2]"),
    ({"frequency_penalty": 3}, "must be in [-2, 2]"),
    ({"logit_bias": {"x": 1.0}}, "'x' is not a token id"),
    ({"logit_bias": {"3": "big"}}, "logit_bias['3']"),
    ({"stop_regex": "(unclosed"}, "stop_regex '(unclosed'"),
    ({"stop_token_ids": [1, "a"]}, "stop_token_ids"),
    ({"max_new_tokens": 1.5}, "integer"),
    ({"ignore_eos": "yes"}, "ignore_eos"),
])
def test_bad_sampling_params_name_the_key(params, needle):
    with pytest.raises(ValueError) as info:
        parse_sampling_params(params)
    assert needle in str(info.value)


def test_neutral_values_of_unsupported_keys_are_accepted():
    assert parse_sampling_params({"n": 1, "repetition_penalty": 1.0, "regex": None}).temperature == 1.0


def test_filter_probs_top_k_top_p_min_p():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]] * 3)
    out = filter_probs(probs, top_k_B=torch.tensor([2, -1, -1]), top_p_B=torch.tensor([1.0, 0.7, 1.0]),
                       min_p_B=torch.tensor([0.0, 0.0, 0.5]))
    assert out[0].tolist() == pytest.approx([0.5, 0.3, 0.0, 0.0])
    assert out[1].tolist() == pytest.approx([0.5, 0.3, 0.0, 0.0])  # 0.5 + 0.3 covers top_p 0.7
    assert out[2].tolist() == pytest.approx([0.5, 0.3, 0.0, 0.0])  # below 0.5 * 0.5 dropped


def test_greedy_logprob_is_log_softmax_of_raw_logits():
    logits = torch.tensor([[1.0, 3.0, 2.0]])
    tokens, logprobs = sample_next_tokens(logits, _batch([{"temperature": 0}]))
    assert tokens.tolist() == [1]
    assert logprobs.item() == pytest.approx(torch.log_softmax(logits, -1)[0, 1].item())


def test_sampled_logprob_is_log_softmax_of_temperature_scaled_logits_before_filtering():
    logits = torch.tensor([[1.0, 3.0, 2.0]])
    tokens, logprobs = sample_next_tokens(logits, _batch([{"temperature": 0.5, "top_k": 2, "sampling_seed": 0}]))
    token = tokens.item()
    assert token in (1, 2)  # top_k=2 excludes token 0
    assert logprobs.item() == pytest.approx(torch.log_softmax(logits / 0.5, -1)[0, token].item())


def test_sampling_frequencies_match_probabilities():
    n = 4000
    logits = torch.log(torch.tensor([0.7, 0.2, 0.1])).repeat(n, 1)
    shared = torch.Generator().manual_seed(123)
    tokens, _ = sample_next_tokens(logits, _batch([{"temperature": 1.0}] * n), shared)
    freq = torch.bincount(tokens, minlength=3).float() / n
    assert freq.tolist() == pytest.approx([0.7, 0.2, 0.1], abs=0.03)


def test_seeded_rows_ignore_their_batch_mates():
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(1))
    alone, _ = sample_next_tokens(logits[1:2], _batch([{"sampling_seed": 7}]))
    together, _ = sample_next_tokens(logits, _batch([{}, {"sampling_seed": 7}, {"temperature": 0}]),
                                     torch.Generator().manual_seed(99))
    assert together[1].item() == alone.item()


def test_seeded_noise_is_exponential_and_moves_with_each_draw():
    """The counter-based noise: Exp(1) (mean 1, P(E > 1) = 1/e), one stream per (seed, draw),
    the draw counter advancing with every sampled token."""
    from relax.backends.hf.sampling import seeded_exponential

    seeds, draws = torch.tensor([7, 7, 8]), torch.tensor([0, 1, 0])
    noise = seeded_exponential(seeds, draws, 20000)
    assert noise.min() > 0 and noise.mean().item() == pytest.approx(1.0, abs=0.03)
    assert (noise > 1).float().mean().item() == pytest.approx(math.exp(-1), abs=0.02)
    assert torch.equal(noise[0], seeded_exponential(torch.tensor([7]), torch.tensor([0]), 20000)[0])
    assert not torch.equal(noise[0], noise[1]) and not torch.equal(noise[0], noise[2])
    batch = _batch([{"sampling_seed": 7}] * 2)
    first, _ = sample_next_tokens(torch.zeros(2, 1000), batch)
    assert first[0] == first[1] and batch.draws_B.tolist() == [1, 1]
    second, _ = sample_next_tokens(torch.zeros(2, 1000), batch)
    assert second[0] != first[0]  # the next draw (flat logits: a different token, 999 times in 1000)


def test_penalties_follow_sglang():
    """Repetition over prompt+output (divide positive logits, multiply negative ones), frequency
    per occurrence and presence once over the output, then the logit bias."""
    logits = torch.tensor([2.0, -1.0, 0.5, 1.0, 0.0])
    params = parse_sampling_params({"repetition_penalty": 2.0, "frequency_penalty": 0.5, "presence_penalty": 0.25,
                                    "logit_bias": {"4": 3.0}})
    out = logits.clone()
    apply_penalties(out, params, prompt_ids=[0], output_ids=[1, 3, 3])
    assert out.tolist() == pytest.approx([2.0 / 2, -1.0 * 2 - 0.5 - 0.25, 0.5, 1.0 / 2 - 1.0 - 0.25, 0.0 + 3.0])
    assert params.has_penalties and not parse_sampling_params({}).has_penalties


def test_penalised_logits_drive_sampling_and_logprobs():
    logits = torch.tensor([[5.0, 0.0, 0.0]])
    params = parse_sampling_params({"temperature": 0, "logit_bias": {"0": -100}})
    apply_penalties(logits[0], params, prompt_ids=[], output_ids=[])
    tokens, logprobs = sample_next_tokens(logits, _batch([{"temperature": 0}]))
    assert tokens.item() != 0 and logprobs.item() == pytest.approx(torch.log_softmax(logits, -1)[0, tokens].item())


def test_stop_regex_compiles_one_or_several():
    assert [p.pattern for p in parse_sampling_params({"stop_regex": r"\d+\."}).stop_regex] == [r"\d+\."]
    assert len(parse_sampling_params({"stop_regex": ["a", "b+"]}).stop_regex) == 2
