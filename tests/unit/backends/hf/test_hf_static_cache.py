"""The slot KV cache decode path (static_cache.py): it is the path Llama-family models take, it
gives what transformers' DynamicCache path gives, rows join and leave slots, and the cache
budget makes rows wait (or says why one can never run)."""

from __future__ import annotations

import pytest
import torch

from relax.backends.hf.decoder import BatchDecoder
from relax.backends.hf.rows import DecodeRow
from relax.backends.hf.sampling import parse_sampling_params
from relax.backends.hf.static_cache import COLUMN_BLOCK, SlotCache, batch_sizes, kv_shape, static_decode_supported

PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [40, 41], [3], [12, 13, 14, 15], [20, 21, 22]]


def _row(prompt, **params) -> DecodeRow:
    return DecodeRow(list(prompt), parse_sampling_params(params))


def _decoder(model, tokenizer, **kw) -> BatchDecoder:
    return BatchDecoder(model, tokenizer, device="cpu", eos_token_ids=[2], max_context_len=512, seed=0, **kw)


def test_qwen3_takes_the_slot_path_and_other_layouts_say_why_not(tiny_model_and_tokenizer):
    model, tokenizer = tiny_model_and_tokenizer
    assert static_decode_supported(model) is None
    assert _decoder(model, tokenizer).slot_cache is not None
    assert _decoder(model, tokenizer, static_cache=False).slot_cache is None
    model.config.use_sliding_window = True
    try:
        assert static_decode_supported(model) == "sliding-window attention layers"
    finally:
        model.config.use_sliding_window = False


def test_slot_path_equals_the_dynamic_cache_path_with_rows_joining_and_leaving(tiny_model_and_tokenizer):
    """Greedy and seeded rows of different lengths, two of them admitted mid-decode: the same
    tokens and (to float32 rounding) the same log-probs on both paths; the slots are all free after."""
    model, tokenizer = tiny_model_and_tokenizer
    first = [_row(PROMPTS[0], temperature=0, max_new_tokens=9, ignore_eos=True),
             _row(PROMPTS[1], temperature=1.0, max_new_tokens=4, sampling_seed=3, ignore_eos=True),
             _row(PROMPTS[2], temperature=0, max_new_tokens=12, ignore_eos=True)]
    later = [_row(PROMPTS[3], temperature=0.8, max_new_tokens=7, sampling_seed=5, ignore_eos=True),
             _row(PROMPTS[4], temperature=0, max_new_tokens=5, ignore_eos=True)]

    def run(decoder: BatchDecoder):
        pending = list(later)

        def admit(running: int):
            return [pending.pop(0)] if pending else []  # one joins at each of the first two steps

        return decoder.run(first, admit=admit)

    slot_decoder = _decoder(model, tokenizer)
    slot, dynamic = run(slot_decoder), run(_decoder(model, tokenizer, static_cache=False))
    assert len(slot) == len(dynamic) == 5
    for a, b in zip(slot, dynamic):
        assert a.output_ids == b.output_ids
        assert a.output_logprobs == pytest.approx(b.output_logprobs, abs=1e-4)
    assert slot_decoder.stats.joins == 2
    cache = slot_decoder.slot_cache
    assert cache.allocated and sorted(cache.free) == list(range(cache.rows))


def test_rows_wait_for_a_slot_within_max_total_tokens(tiny_model_and_tokenizer, reference_greedy):
    """A budget of two rows of COLUMN_BLOCK columns: four rows decode two at a time, each as alone."""
    model, tokenizer = tiny_model_and_tokenizer
    decoder = _decoder(model, tokenizer, max_total_tokens=2 * COLUMN_BLOCK)
    rows = [_row(p, temperature=0, max_new_tokens=5, ignore_eos=True) for p in PROMPTS[:4]]
    results = decoder.run(rows)
    for prompt, result in zip(PROMPTS, results):
        assert result.output_ids == reference_greedy(model, prompt, 5)[0]
    assert decoder.slot_cache.rows == 2 and decoder.stats.batches == 1 and decoder.stats.joins >= 1


def test_a_request_larger_than_the_budget_is_aborted_with_the_fix(tiny_model_and_tokenizer):
    model, tokenizer = tiny_model_and_tokenizer
    decoder = _decoder(model, tokenizer, max_total_tokens=COLUMN_BLOCK)
    result = decoder.run([_row(PROMPTS[0], temperature=0, max_new_tokens=COLUMN_BLOCK, ignore_eos=True)])[0]
    assert result.finish_reason["type"] == "abort"
    assert "KV cache token slots" in result.finish_reason["message"]
    assert "--max-total-tokens" in result.finish_reason["message"]


def test_release_frees_the_buffers_and_the_next_batch_allocates_again(tiny_model_and_tokenizer):
    model, tokenizer = tiny_model_and_tokenizer
    decoder = _decoder(model, tokenizer)
    row = _row(PROMPTS[0], temperature=0, max_new_tokens=4, ignore_eos=True)
    before = decoder.run([row])[0]
    decoder.release_cache()
    assert not decoder.slot_cache.allocated
    assert decoder.run([_row(PROMPTS[0], temperature=0, max_new_tokens=4, ignore_eos=True)])[0].output_ids \
        == before.output_ids
    assert decoder.slot_cache.allocated


def test_cache_grows_columns_keeping_what_it_holds(tiny_model_and_tokenizer):
    model, _ = tiny_model_and_tokenizer
    cache = SlotCache(kv_shape(model), torch.device("cpu"), max_rows=8, max_total_tokens=None)
    assert cache.reserve(2, 10) == 2 and cache.columns == COLUMN_BLOCK
    slots = cache.take(2)
    cache.keys[0][slots[0], :, 3] = 7.0
    assert cache.reserve(1, COLUMN_BLOCK + 1) == 1 and cache.columns == 2 * COLUMN_BLOCK
    assert bool((cache.keys[0][slots[0], :, 3] == 7.0).all())


def test_captured_batch_sizes_cover_every_row_count():
    sizes = batch_sizes(256)
    assert sizes[:4] == [1, 2, 4, 8] and sizes[-1] == 256 and sizes == sorted(set(sizes))
    assert batch_sizes(5)[-1] == 5 and all(s <= 5 for s in batch_sizes(5))


def _stress(model, tokenizer, device: str, *, cuda_graphs: bool = True, seed: int = 0,
            decoder: BatchDecoder | None = None) -> BatchDecoder:
    """48 seeded rows of random prompt lengths and budgets, 6 joining at every step while the
    first 12 decode (rows finish and free slots while others take them). Every row's reported
    log-probs must equal one full forward of its prompt + output, alone (no cache, no padding)."""
    import random

    rng = random.Random(seed)
    vocab = model.config.vocab_size
    rows = [_row([rng.randrange(4, vocab) for _ in range(rng.randint(1, 20))], temperature=1.0,
                 max_new_tokens=rng.randint(1, 30), sampling_seed=i, ignore_eos=True) for i in range(48)]
    first, pending = rows[:12], rows[12:]

    def admit(running: int):
        taken = pending[:6]
        del pending[:6]
        return taken

    decoder = decoder or BatchDecoder(model, tokenizer, device=device, eos_token_ids=[2], max_context_len=512,
                                      seed=0, max_running_requests=16, cuda_graphs=cuda_graphs)
    results = decoder.run(first, admit=admit)
    assert len(results) == 48 and decoder.stats.joins > 0
    for row, result in zip(rows, results):
        assert len(result.output_ids) == row.params.max_new_tokens
        full = torch.tensor([row.prompt_ids + result.output_ids], device=device)
        with torch.no_grad():
            logits = model(full).logits[0, len(row.prompt_ids) - 1:-1].float()
        expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(result.output_ids, device=device)[:, None])
        assert result.output_logprobs == pytest.approx(expected.squeeze(-1).tolist(), abs=2e-4)
    return decoder


def test_rows_coming_and_going_keep_their_own_cache(tiny_model_and_tokenizer):
    model, tokenizer = tiny_model_and_tokenizer
    _stress(model, tokenizer, "cpu")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("cuda_graphs", [True, False], ids=["graphs", "eager"])
def test_rows_coming_and_going_on_a_gpu(tiny_model_and_tokenizer, cuda_graphs):
    """The same on a GPU, where steps run over captured (rows, columns) sizes with dummy slots;
    then weights change in place and the captured graphs decode with the new ones."""
    model, tokenizer = tiny_model_and_tokenizer
    model = model.to("cuda")
    try:
        decoder = _stress(model, tokenizer, "cuda", cuda_graphs=cuda_graphs)
        if cuda_graphs:
            assert decoder.runner.graphs
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.05)
        _stress(model, tokenizer, "cuda", cuda_graphs=cuda_graphs, seed=1, decoder=decoder)  # the same graphs
    finally:
        model.to("cpu")


def test_rows_arriving_a_few_at_a_time_grow_the_cache_geometrically(tiny_model_and_tokenizer):
    """A fully async rollout joins a few rows per step: the buffers (and graphs) must not be
    rebuilt for every new row."""
    model, _ = tiny_model_and_tokenizer
    cache = SlotCache(kv_shape(model), torch.device("cpu"), max_rows=256, max_total_tokens=None)
    for _ in range(100):
        assert cache.reserve(1, 10) == 1
        cache.take(1)
    assert cache.version <= 9 and cache.rows in batch_sizes(256) and cache.rows >= 100
