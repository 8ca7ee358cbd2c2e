"""Constrained decoding (grammar.py): parsing and compiling constraints with llguidance, the token
mask in the decoder's sampler, and the log-probs a constrained row reports."""

from __future__ import annotations

import json
import re

import pytest
import torch

from relax.backends.hf.decoder import BatchDecoder
from relax.backends.hf.grammar import (
    GrammarCompiler, allowed_tokens, parse_constraint, unpack_bits, unpack_bits_by_shifts,
)
from relax.backends.hf.rows import DecodeRow
from relax.backends.hf.sampling import parse_sampling_params
from relax.backends.hf.tiny_model import build_tiny_bpe_qwen3

PROMPT = [5, 6, 7, 8]
EMAIL = r"[a-z]{1,6}@[a-z]{1,5}\.(com|org)"


@pytest.fixture(scope="module")
def bpe_model(tmp_path_factory):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = build_tiny_bpe_qwen3(tmp_path_factory.mktemp("bpe-qwen3"), seed=0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model: more threads only contend with the machine's other work
    yield AutoModelForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def compiler(bpe_model):
    model, tokenizer = bpe_model
    return GrammarCompiler(tokenizer, model.config.vocab_size, [tokenizer.eos_token_id])


def _decode(bpe_model, compiler, params_list):
    model, tokenizer = bpe_model
    rows = []
    for params in params_list:
        parsed = parse_sampling_params(params)
        grammar = compiler.row_grammar(parsed.constraint) if parsed.constraint else None
        rows.append(DecodeRow(list(PROMPT), parsed, grammar=grammar))
    decoder = BatchDecoder(model, tokenizer, device="cpu", eos_token_ids=[tokenizer.eos_token_id],
                           max_context_len=512, seed=0)
    return decoder.run(rows)


def test_parse_constraint_takes_strings_and_json_objects():
    assert parse_constraint({}) is None
    assert parse_constraint({"regex": "a+"}).source == "a+"
    assert json.loads(parse_constraint({"json_schema": {"type": "object"}}).source) == {"type": "object"}
    with pytest.raises(ValueError, match="sampling_params.regex must be a non-empty string"):
        parse_constraint({"regex": ""})


@pytest.mark.parametrize("params, needle", [
    ({"regex": "[a-"}, "sampling_params.regex: invalid regular expression"),
    ({"json_schema": "{not json"}, "sampling_params.json_schema is not valid JSON"),
    ({"json_schema": '{"type": "object", "properties": {"a": {"$ref": "#/nope"}}}'},
     "sampling_params.json_schema: invalid JSON schema"),
    ({"ebnf": "root ::= undefined_rule"}, "sampling_params.ebnf"),
    ({"structural_tag": {"structures": [{"begin": "<f>", "schema": {}, "end": "</f>"}], "triggers": ["<g"]}},
     "starts with none of the triggers"),
])
def test_a_bad_grammar_is_an_error_naming_its_key(compiler, params, needle):
    with pytest.raises(ValueError, match=re.escape(needle)):
        compiler.row_grammar(parse_constraint(params))


def test_a_word_level_tokenizer_is_refused_with_the_reason(tiny_model_and_tokenizer):
    _, tokenizer = tiny_model_and_tokenizer  # decodes words joined by spaces: token texts do not spell it
    words = GrammarCompiler(tokenizer, len(tokenizer), [tokenizer.eos_token_id])
    with pytest.raises(ValueError, match="tokens' texts concatenate to its decoded text"):
        words.row_grammar(parse_constraint({"regex": "a+"}))


def test_every_sampled_regex_output_matches(bpe_model, compiler):
    results = _decode(bpe_model, compiler, [{"temperature": 1.0, "max_new_tokens": 40, "sampling_seed": s,
                                             "regex": EMAIL} for s in range(24)])
    assert all(re.fullmatch(EMAIL, r.text) for r in results), [r.text for r in results]
    assert all(r.finish_reason["type"] == "stop" for r in results)
    assert len({r.text for r in results}) > 1  # sampled, not one forced string


def test_ebnf_and_ignore_eos_end_when_the_grammar_takes_eos(bpe_model, compiler):
    results = _decode(bpe_model, compiler, [{"temperature": 1.0, "sampling_seed": s, "ignore_eos": True,
                                             "ebnf": 'root ::= "yes" | "no" | "maybe"'} for s in range(6)])
    assert {r.text for r in results} <= {"yes", "no", "maybe"}
    assert all(r.finish_reason == {"type": "stop", "matched": 2} and r.output_ids[-1] == 2 for r in results)


def test_a_constrained_rows_logprobs_are_those_of_the_masked_distribution(bpe_model, compiler):
    """Each reported log-prob is log_softmax over the tokens the grammar allowed at that step (at the
    row's temperature), recomputed here by one full forward and llguidance's own masks."""
    model, tokenizer = bpe_model
    params = {"temperature": 0.8, "max_new_tokens": 30, "sampling_seed": 3, "regex": EMAIL}
    result = _decode(bpe_model, compiler, [params])[0]
    replay = compiler.row_grammar(parse_sampling_params(params).constraint)
    with torch.no_grad():
        logits_LV = model(torch.tensor([PROMPT + result.output_ids])).logits[0, len(PROMPT) - 1:-1].float()
    for step, (token, logprob) in enumerate(zip(result.output_ids, result.output_logprobs)):
        allowed_V = allowed_tokens([replay], logits_LV.shape[1])[0]
        expected = torch.log_softmax((logits_LV[step] / 0.8).masked_fill(~allowed_V, float("-inf")), -1)[token]
        unconstrained = torch.log_softmax(logits_LV[step] / 0.8, -1)[token]
        assert logprob == pytest.approx(float(expected), abs=1e-4)
        assert allowed_V.sum() == 1 or float(expected) > float(unconstrained)  # the mask moved the mass
        replay.accept(token)


def test_unconstrained_rows_in_the_same_batch_are_untouched(bpe_model, compiler):
    free = {"temperature": 1.0, "max_new_tokens": 8, "sampling_seed": 7, "ignore_eos": True}
    alone = _decode(bpe_model, compiler, [free])[0]
    mixed = _decode(bpe_model, compiler, [{**free, "regex": EMAIL}, free])[1]
    assert mixed.output_ids == alone.output_ids
    assert mixed.output_logprobs == pytest.approx(alone.output_logprobs, abs=1e-5)


def test_the_gpus_bit_unpacking_equals_the_cpus():
    """The GPU path unpacks masks by torch shifts, the CPU path by numpy: the same bits, every
    word's sign bit included, for a vocabulary that ends mid-word."""
    bits_GW = torch.randint(-2**31, 2**31 - 1, (3, 5), dtype=torch.int32)
    bits_GW[0, 0] = -1  # all 32 bits
    expected = unpack_bits(bits_GW, 150, torch.device("cpu"))
    assert expected.shape == (3, 150) and expected[0, :32].all()
    assert torch.equal(unpack_bits_by_shifts(bits_GW, 150), expected)
