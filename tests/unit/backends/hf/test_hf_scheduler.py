"""The scheduler: bursts share a batch, queued aborts resolve at once, pause holds new work."""

from __future__ import annotations

import asyncio

from relax.backends.hf.decoder import DecodeRow, DecodeStats, RowResult
from relax.backends.hf.sampling import parse_sampling_params
from relax.backends.hf.scheduler import Scheduler


class RecordingDecoder:
    """Stands in for BatchDecoder: answers every row with one token and records batch sizes."""

    def __init__(self):
        self.stats, self.batches = DecodeStats(), []

    def run(self, rows, *, on_finish=None, before_step=None):
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
