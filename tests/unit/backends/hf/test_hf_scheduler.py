"""The scheduler: bursts share a batch, late requests join a running batch, queued aborts resolve at
once, pause holds new work."""

from __future__ import annotations

import asyncio

from relax.backends.hf.decoder import BatchDecoder
from relax.backends.hf.rows import DecodeRow, DecodeStats, RowResult
from relax.backends.hf.sampling import parse_sampling_params
from relax.backends.hf.scheduler import Scheduler


class RecordingDecoder:
    """Stands in for BatchDecoder: answers every row with one token and records batch sizes."""

    def __init__(self):
        self.stats, self.batches = DecodeStats(), []

    def run(self, rows, *, on_finish=None, before_step=None, admit=None):
        self.batches.append(len(rows))
        for i, _ in enumerate(rows):
            on_finish(i, RowResult([1], [-0.1], {"type": "length", "length": 1}, "x"))


def _row() -> DecodeRow:
    return DecodeRow([5], parse_sampling_params({"max_new_tokens": 1}))


def test_a_staggered_burst_is_decoded_as_one_batch():
    async def go():
        decoder = RecordingDecoder()
        scheduler = Scheduler(decoder, batch_wait_s=0.5, quiet_s=0.05)
        scheduler.start()
        tasks = []
        for i in range(5):  # arrivals 10 ms apart, inside the quiet period
            tasks.append(asyncio.create_task(scheduler.generate(f"r{i}", _row())))
            await asyncio.sleep(0.01)
        results = await asyncio.gather(*tasks)
        await scheduler.stop()
        return decoder.batches, results
    batches, results = asyncio.run(go())
    assert batches == [5]
    assert all(r.output_ids == [1] for r in results)


def test_max_running_requests_splits_the_queue():
    async def go():
        decoder = RecordingDecoder()
        scheduler = Scheduler(decoder, max_running_requests=2, batch_wait_s=0.5, quiet_s=0.05)
        scheduler.start()
        await asyncio.gather(*(scheduler.generate(f"r{i}", _row()) for i in range(5)))
        await scheduler.stop()
        return decoder.batches
    assert asyncio.run(go()) == [2, 2, 1]


def test_abort_of_a_queued_request_resolves_it_and_pause_holds_the_rest():
    async def go():
        decoder = RecordingDecoder()
        scheduler = Scheduler(decoder, batch_wait_s=0.01)
        scheduler.start()
        await scheduler.pause("abort")
        first = asyncio.create_task(scheduler.generate("a", _row()))
        second = asyncio.create_task(scheduler.generate("b", _row()))
        await asyncio.sleep(0.05)
        assert scheduler.abort("a") == 1
        aborted = await first
        assert not second.done() and decoder.batches == []
        scheduler.resume()
        done = await second
        await scheduler.stop()
        return aborted, done, decoder.batches
    aborted, done, batches = asyncio.run(go())
    assert aborted.finish_reason["type"] == "abort" and aborted.output_ids == []
    assert done.output_ids == [1] and batches == [1]


def test_a_result_carries_the_weight_version_its_row_ended_on():
    """The version is stamped as the row ends (and as a queued request is aborted), not when its reply is
    built: a push that aborted it may take a new version before the event loop gets to the reply (a
    partial rollout's first segment was then labelled with the next version)."""
    now = {"version": "1"}

    class PushAfterTheRow(RecordingDecoder):
        def run(self, rows, **kw):
            super().run(rows, **kw)
            now["version"] = "2"  # the push lands between the row's end and its reply

    async def go():
        scheduler = Scheduler(PushAfterTheRow(), batch_wait_s=0.01, version=lambda: now["version"])
        scheduler.start()
        ended = await scheduler.generate("a", _row())
        await scheduler.pause("abort")
        queued = asyncio.create_task(scheduler.generate("b", _row()))
        await asyncio.sleep(0.02)
        now["version"] = "3"
        scheduler.abort("b")
        now["version"] = "4"
        aborted = await queued
        await scheduler.stop()
        return ended, aborted
    ended, aborted = asyncio.run(go())
    assert (ended.weight_version, now["version"]) == ("1", "4")
    assert aborted.weight_version == "3" and aborted.finish_reason["type"] == "abort"


# ---- continuous batching with the real decoder -----------------------------------------------

def _greedy(prompt, n) -> DecodeRow:
    return DecodeRow(list(prompt), parse_sampling_params({"temperature": 0, "max_new_tokens": n, "ignore_eos": True}))


async def _until(predicate, timeout: float = 30.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition never became true"
        await asyncio.sleep(0.002)


def test_a_request_submitted_mid_decode_joins_the_running_batch_and_finishes_first(tiny_model_and_tokenizer):
    model, tokenizer = tiny_model_and_tokenizer

    async def go():
        decoder = BatchDecoder(model, tokenizer, device="cpu", eos_token_ids=[2], max_context_len=512, seed=0)
        scheduler = Scheduler(decoder, batch_wait_s=0.01)
        scheduler.start()
        long = asyncio.create_task(scheduler.generate("long", _greedy([5, 6, 7], 400)))
        await _until(lambda: decoder.stats.forward_calls >= 3)  # the long row is mid-decode
        short = await scheduler.generate("short", _greedy([40, 41, 42, 43, 44], 5))
        long_done_when_short_finished = long.done()
        info = scheduler.info()
        long_result = await long
        await scheduler.stop()
        return short, long_result, long_done_when_short_finished, info
    short, long_result, long_done, info = asyncio.run(go())
    assert not long_done and long_result.finish_reason == {"type": "length", "length": 400}
    assert (info["num_batches"], info["num_joins"], info["num_joined_requests"]) == (1, 1, 1)
    assert info["recent_batch_sizes"] == [1, 2] and info["running_requests"] == 1
    alone = BatchDecoder(model, tokenizer, device="cpu", eos_token_ids=[2], max_context_len=512).run(
        [_greedy([40, 41, 42, 43, 44], 5)])[0]
    assert short.output_ids == alone.output_ids


def test_joins_respect_max_running_requests(tiny_model_and_tokenizer):
    model, tokenizer = tiny_model_and_tokenizer

    async def go():
        decoder = BatchDecoder(model, tokenizer, device="cpu", eos_token_ids=[2], max_context_len=512, seed=0)
        scheduler = Scheduler(decoder, max_running_requests=2, batch_wait_s=0.01)
        scheduler.start()
        long = asyncio.create_task(scheduler.generate("long", _greedy([5, 6, 7], 300)))
        await _until(lambda: decoder.stats.forward_calls >= 2)
        shorts = await asyncio.gather(*(scheduler.generate(f"s{i}", _greedy([10 + i], 3)) for i in range(3)))
        info = scheduler.info()
        scheduler.abort("long")
        aborted = await long
        await scheduler.stop()
        return shorts, info, aborted
    shorts, info, aborted = asyncio.run(go())
    assert all(len(s.output_ids) == 3 for s in shorts)
    assert info["num_batches"] == 1 and info["num_joined_requests"] == 3
    assert max(info["recent_batch_sizes"]) == 2
    assert aborted.finish_reason["type"] == "abort" and 0 < len(aborted.output_ids) < 300


def test_requests_queued_during_an_in_place_pause_join_after_continue(tiny_model_and_tokenizer):
    model, tokenizer = tiny_model_and_tokenizer

    async def go():
        decoder = BatchDecoder(model, tokenizer, device="cpu", eos_token_ids=[2], max_context_len=512, seed=0)
        scheduler = Scheduler(decoder, batch_wait_s=0.01)
        scheduler.start()
        long = asyncio.create_task(scheduler.generate("long", _greedy([5, 6, 7], 300)))
        await _until(lambda: decoder.stats.forward_calls >= 2)
        await scheduler.pause("in_place")
        late = asyncio.create_task(scheduler.generate("late", _greedy([9, 8], 4)))
        await _until(lambda: scheduler.info()["queued_requests"] == 1)
        calls = decoder.stats.forward_calls
        await asyncio.sleep(0.05)  # paused: no forward runs and the late request stays queued
        held = (decoder.stats.forward_calls - calls, scheduler.info()["queued_requests"])
        scheduler.resume()
        late_result = await late
        long_done = long.done()
        scheduler.abort("long")
        await long
        await scheduler.stop()
        return held, late_result, long_done, decoder.stats
    held, late_result, long_done, stats = asyncio.run(go())
    assert held[0] <= 1 and held[1] == 1
    assert len(late_result.output_ids) == 4 and not long_done
    assert (stats.batches, stats.joins) == (1, 1)
