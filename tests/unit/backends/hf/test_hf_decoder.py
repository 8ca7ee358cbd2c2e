"""The batched decoder: padding-free results, seeded sampling, finish reasons, abort, rows joining mid-decode."""

from __future__ import annotations

import pytest
import torch

from relax.backends.hf.decoder import BatchDecoder
from relax.backends.hf.rows import DecodeRow
from relax.backends.hf.sampling import parse_sampling_params

PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [40, 41], [3], [12, 13, 14, 15]]


def _decoder(model, tokenizer, eos=(2,)) -> BatchDecoder:
    return BatchDecoder(model, tokenizer, device="cpu", eos_token_ids=list(eos), max_context_len=512, seed=0)


def _row(prompt, **params) -> DecodeRow:
    return DecodeRow(list(prompt), parse_sampling_params(params))


def test_batched_greedy_matches_each_prompt_decoded_alone(tiny_model_and_tokenizer, reference_greedy):
    model, tokenizer = tiny_model_and_tokenizer
    lengths = [9, 3, 12, 6]  # rows finish at different steps, so the batch shrinks mid-decode
    rows = [_row(p, temperature=0, max_new_tokens=n, ignore_eos=True) for p, n in zip(PROMPTS, lengths)]
    results = _decoder(model, tokenizer).run(rows)
    for prompt, n, result in zip(PROMPTS, lengths, results):
        tokens, logprobs = reference_greedy(model, prompt, n)
        assert result.output_ids == tokens
        assert result.output_logprobs == pytest.approx(logprobs, abs=1e-4)
        assert result.finish_reason == {"type": "length", "length": n}


def test_a_group_of_samples_of_one_prompt_prefills_it_once_and_decodes_apart(tiny_model_and_tokenizer,
                                                                             reference_greedy):
    """Four samples of PROMPTS[0] and two of PROMPTS[1]: two prompts prefilled, six rows decoded,
    greedy rows as decoded alone, seeded rows as alone, and the samples differ from each other."""
    model, tokenizer = tiny_model_and_tokenizer
    decoder = _decoder(model, tokenizer)
    rows = [_row(PROMPTS[0], temperature=0, max_new_tokens=6, ignore_eos=True)] + \
        [_row(PROMPTS[0], temperature=1.0, max_new_tokens=6, sampling_seed=s, ignore_eos=True) for s in (1, 2, 3)] + \
        [_row(PROMPTS[1], temperature=0, max_new_tokens=4, ignore_eos=True)] * 2
    results = decoder.run(rows)
    assert decoder.stats.prefill_rows_shared == 4
    tokens, _ = reference_greedy(model, PROMPTS[0], 6)
    assert results[0].output_ids == tokens
    assert results[4].output_ids == results[5].output_ids == reference_greedy(model, PROMPTS[1], 4)[0]
    alone = _decoder(model, tokenizer).run([rows[2]])[0]
    assert results[2].output_ids == alone.output_ids
    assert len({tuple(r.output_ids) for r in results[1:4]}) > 1


def test_logprobs_match_log_softmax_of_one_full_forward(tiny_model_and_tokenizer):
    model, tokenizer = tiny_model_and_tokenizer
    rows = [_row(p, temperature=0.7, max_new_tokens=8, sampling_seed=i, ignore_eos=True)
            for i, p in enumerate(PROMPTS)]
    for prompt, result in zip(PROMPTS, _decoder(model, tokenizer).run(rows)):
        full = torch.tensor([prompt + result.output_ids])
        with torch.no_grad():
            logits = model(full).logits[0, len(prompt) - 1:-1].float()
        expected = torch.log_softmax(logits / 0.7, -1).gather(-1, torch.tensor(result.output_ids)[:, None])
        assert result.output_logprobs == pytest.approx(expected.squeeze(-1).tolist(), abs=1e-4)


def test_seeded_sampling_gives_same_tokens_alone_or_batched(tiny_model_and_tokenizer):
    model, tokenizer = tiny_model_and_tokenizer
    params = dict(temperature=1.0, top_p=0.9, max_new_tokens=16, sampling_seed=1234, ignore_eos=True)
    alone = _decoder(model, tokenizer).run([_row(PROMPTS[1], **params)])[0]
    mates = [_row(PROMPTS[0], temperature=1.0, max_new_tokens=5), _row(PROMPTS[1], **params),
             _row(PROMPTS[2], temperature=0.8, max_new_tokens=20, sampling_seed=5), _row(PROMPTS[3], temperature=0)]
    batched = _decoder(model, tokenizer).run(mates)[1]
    assert batched.output_ids == alone.output_ids
    other_seed = _decoder(model, tokenizer).run([_row(PROMPTS[1], **{**params, "sampling_seed": 99})])[0]
    assert other_seed.output_ids != alone.output_ids


def test_stop_token_id_finishes_with_stop_and_trims_text(tiny_model_and_tokenizer):
    model, tokenizer = tiny_model_and_tokenizer
    free = _decoder(model, tokenizer).run([_row(PROMPTS[0], temperature=0, max_new_tokens=10, ignore_eos=True)])[0]
    stop_id = free.output_ids[4]
    first = free.output_ids.index(stop_id)
    result = _decoder(model, tokenizer).run([_row(PROMPTS[0], temperature=0, max_new_tokens=10,
                                                  stop_token_ids=[stop_id])])[0]
    assert result.finish_reason == {"type": "stop", "matched": stop_id}
    assert result.output_ids == free.output_ids[:first + 1]
    assert result.text == tokenizer.decode(free.output_ids[:first], skip_special_tokens=True)


def test_eos_finishes_with_stop_unless_ignore_eos(tiny_model_and_tokenizer):
    model, tokenizer = tiny_model_and_tokenizer
    free = _decoder(model, tokenizer).run([_row(PROMPTS[3], temperature=0, max_new_tokens=6, ignore_eos=True)])[0]
    eos = free.output_ids[2]
    decoder = _decoder(model, tokenizer, eos=(eos,))
    stopped = decoder.run([_row(PROMPTS[3], temperature=0, max_new_tokens=6)])[0]
    assert stopped.finish_reason == {"type": "stop", "matched": eos}
    assert stopped.output_ids[-1] == eos and len(stopped.output_ids) <= 3
    ignored = decoder.run([_row(PROMPTS[3], temperature=0, max_new_tokens=6, ignore_eos=True)])[0]
    assert ignored.finish_reason["type"] == "length" and len(ignored.output_ids) == 6


def test_stop_string_finishes_with_matched_string(tiny_model_and_tokenizer):
    model, tokenizer = tiny_model_and_tokenizer
    free = _decoder(model, tokenizer).run([_row(PROMPTS[2], temperature=0, max_new_tokens=8, ignore_eos=True)])[0]
    stop = tokenizer.decode(free.output_ids[:3])  # only the first three tokens together can produce it
    trimmed, kept = _decoder(model, tokenizer).run([
        _row(PROMPTS[2], temperature=0, max_new_tokens=8, ignore_eos=True, stop=[stop]),
        _row(PROMPTS[2], temperature=0, max_new_tokens=8, ignore_eos=True, stop=stop, no_stop_trim=True)])
    assert trimmed.finish_reason == {"type": "stop", "matched": stop}
    assert trimmed.output_ids == free.output_ids[:3]
    assert trimmed.text == ""
    assert kept.text == stop


def test_min_new_tokens_blocks_stop_tokens(tiny_model_and_tokenizer):
    model, tokenizer = tiny_model_and_tokenizer
    free = _decoder(model, tokenizer).run([_row(PROMPTS[1], temperature=0, max_new_tokens=4, ignore_eos=True)])[0]
    first = free.output_ids[0]
    result = _decoder(model, tokenizer).run([_row(PROMPTS[1], temperature=0, max_new_tokens=4, min_new_tokens=3,
                                                  stop_token_ids=[first])])[0]
    assert first not in result.output_ids[:3]


def test_zero_max_new_tokens_and_context_limit(tiny_model_and_tokenizer):
    model, tokenizer = tiny_model_and_tokenizer
    decoder = BatchDecoder(model, tokenizer, device="cpu", eos_token_ids=[2], max_context_len=10)
    zero, capped = decoder.run([_row(PROMPTS[0], max_new_tokens=0), _row(PROMPTS[0], max_new_tokens=None,
                                                                         ignore_eos=True, temperature=0)])
    assert zero.output_ids == [] and zero.finish_reason == {"type": "length", "length": 0}
    assert len(capped.output_ids) == 10 - len(PROMPTS[0]) and capped.finish_reason["type"] == "length"


def test_abort_stops_one_row_and_the_others_finish(tiny_model_and_tokenizer):
    model, tokenizer = tiny_model_and_tokenizer
    rows = [_row(p, temperature=0, max_new_tokens=10, ignore_eos=True) for p in PROMPTS[:2]]
    steps = []

    def before_step():
        steps.append(1)
        if len(steps) == 4:
            rows[0].abort_event.set()

    finished = []
    results = _decoder(model, tokenizer).run(rows, before_step=before_step,
                                             on_finish=lambda i, r: finished.append(i))
    assert results[0].finish_reason["type"] == "abort" and len(results[0].output_ids) == 3
    assert results[1].finish_reason == {"type": "length", "length": 10}
    assert finished == [0, 1]


# ---- continuous batching: groups joining a running batch ------------------------------------

def _admit_at(schedule: dict[int, list[DecodeRow]], seen: list[int]):
    """An `admit` callback handing over schedule[k] at the k-th step boundary (the first is right
    after the prefill); records the running size it is called with."""
    calls = []

    def admit(running: int) -> list[DecodeRow]:
        calls.append(1)
        seen.append(running)
        return schedule.get(len(calls), [])
    return admit


def test_rows_joining_mid_decode_give_the_same_greedy_tokens_as_decoded_alone(tiny_model_and_tokenizer,
                                                                              reference_greedy):
    model, tokenizer = tiny_model_and_tokenizer
    first = [_row(PROMPTS[2], temperature=0, max_new_tokens=14, ignore_eos=True),
             _row(PROMPTS[1], temperature=0, max_new_tokens=4, ignore_eos=True)]  # finishes: trims the cache
    # step 2: a longer prompt than the running cache (running rows get padded); step 6: shorter ones
    joining = {2: [_row(PROMPTS[0], temperature=0, max_new_tokens=7, ignore_eos=True)],
               6: [_row(PROMPTS[3], temperature=0, max_new_tokens=9, ignore_eos=True),
                   _row([30], temperature=0, max_new_tokens=3, ignore_eos=True)]}
    seen: list[int] = []
    decoder = _decoder(model, tokenizer)
    results = decoder.run(first, admit=_admit_at(joining, seen))
    rows = first + joining[2] + joining[6]
    assert len(results) == 5
    for row, result in zip(rows, results):
        tokens, logprobs = reference_greedy(model, row.prompt_ids, row.params.max_new_tokens)
        assert result.output_ids == tokens
        assert result.output_logprobs == pytest.approx(logprobs, abs=1e-4)
    assert (decoder.stats.batches, decoder.stats.joins, decoder.stats.joined_requests) == (1, 2, 3)
    assert decoder.stats.recent_batch_sizes == [2, 3, 4]  # after the start, after each join
    # running size at each step boundary after the prefill: row 1 leaves after its 4th token
    assert seen[:7] == [2, 2, 3, 2, 2, 2, 4]


def test_seeded_sampling_and_logprobs_are_the_same_alone_or_joined(tiny_model_and_tokenizer):
    model, tokenizer = tiny_model_and_tokenizer
    params = dict(temperature=0.7, top_p=0.9, max_new_tokens=12, sampling_seed=77, ignore_eos=True)
    alone = _decoder(model, tokenizer).run([_row(PROMPTS[0], **params)])[0]
    mates = [_row(PROMPTS[3], temperature=1.0, max_new_tokens=20, ignore_eos=True),
             _row(PROMPTS[2], temperature=0.9, max_new_tokens=6, sampling_seed=3, ignore_eos=True)]
    joined = _decoder(model, tokenizer).run(mates, admit=_admit_at({3: [_row(PROMPTS[0], **params)]}, []))[2]
    assert joined.output_ids == alone.output_ids
    assert joined.output_logprobs == pytest.approx(alone.output_logprobs, abs=1e-5)
    full = torch.tensor([PROMPTS[0] + joined.output_ids])
    with torch.no_grad():
        logits = model(full).logits[0, len(PROMPTS[0]) - 1:-1].float()
    expected = torch.log_softmax(logits / 0.7, -1).gather(-1, torch.tensor(joined.output_ids)[:, None])
    assert joined.output_logprobs == pytest.approx(expected.squeeze(-1).tolist(), abs=1e-4)


def test_an_aborted_joining_row_is_answered_without_stopping_the_batch(tiny_model_and_tokenizer):
    model, tokenizer = tiny_model_and_tokenizer
    late = _row(PROMPTS[3], temperature=0, max_new_tokens=5, ignore_eos=True)
    late.abort_event.set()
    finished = []
    results = _decoder(model, tokenizer).run([_row(PROMPTS[0], temperature=0, max_new_tokens=6, ignore_eos=True)],
                                             admit=_admit_at({2: [late]}, []),
                                             on_finish=lambda i, r: finished.append(i))
    assert results[1].finish_reason["type"] == "abort" and results[1].output_ids == []
    assert results[0].finish_reason == {"type": "length", "length": 6}
    assert finished == [1, 0]


def test_penalties_act_per_row_in_a_batch(tiny_model_and_tokenizer):
    """A logit bias forces its token; a repetition penalty changes a greedy row that repeats; a row
    without penalties in the same batch decodes as alone."""
    model, tokenizer = tiny_model_and_tokenizer
    plain = _decoder(model, tokenizer).run([_row(PROMPTS[0], temperature=0, max_new_tokens=12, ignore_eos=True)])[0]
    assert len(set(plain.output_ids)) < len(plain.output_ids)  # the tiny model repeats itself
    rows = [_row(PROMPTS[0], temperature=0, max_new_tokens=12, ignore_eos=True, logit_bias={"9": 100.0}),
            _row(PROMPTS[0], temperature=0, max_new_tokens=12, ignore_eos=True, repetition_penalty=2.0,
                 frequency_penalty=1.0),
            _row(PROMPTS[0], temperature=0, max_new_tokens=12, ignore_eos=True)]
    biased, penalised, same = _decoder(model, tokenizer).run(rows)
    assert biased.output_ids == [9] * 12
    assert penalised.output_ids != plain.output_ids
    assert len(set(penalised.output_ids)) > len(set(plain.output_ids))
    assert same.output_ids == plain.output_ids


def test_stop_regex_stops_at_the_first_match_and_trims_it(tiny_model_and_tokenizer):
    import re

    model, tokenizer = tiny_model_and_tokenizer
    three = tokenizer.decode([9, 9, 9])  # the text of three forced tokens
    row = _row(PROMPTS[1], temperature=0, max_new_tokens=20, ignore_eos=True, logit_bias={"9": 100.0},
               stop_regex=["never-matches", re.escape(three)])
    result = _decoder(model, tokenizer).run([row])[0]
    assert result.output_ids == [9, 9, 9]
    assert result.finish_reason == {"type": "stop", "matched": three}
    assert result.text == ""  # the match is trimmed, as a stop string is


def test_unbanned_logprobs_recover_the_full_distribution():
    """Sampling with tokens masked out reports the log-probs of the unmasked distribution."""
    from relax.backends.hf.decoder import unbanned_logprobs

    torch.manual_seed(0)
    logits_BV, banned = torch.randn(3, 11) * 3, torch.tensor([2, 7])
    temperature_B = torch.tensor([1.0, 0.7, 1.3])
    tokens_B = torch.tensor([0, 5, 10])
    masked_BV = logits_BV.clone()
    masked_BV[:, banned] = float("-inf")
    masked_B = torch.log_softmax(masked_BV / temperature_B[:, None], -1).gather(-1, tokens_B[:, None])[:, 0]
    full_B = torch.log_softmax(logits_BV / temperature_B[:, None], -1).gather(-1, tokens_B[:, None])[:, 0]
    got_B = unbanned_logprobs(masked_B, logits_BV.gather(-1, tokens_B[:, None])[:, 0], logits_BV[:, banned],
                              temperature_B)
    assert torch.allclose(got_B, full_B, atol=1e-6) and not torch.allclose(masked_B, full_B, atol=1e-3)
