"""Trainer side of the weight push: WeightSender against fake engines (HTTP and CUDA IPC receivers)."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import httpx
import pytest
import torch

from relax.distributed.weights.group import create_weight_group
from relax.distributed.weights.protocol import WeightSyncError
from relax.distributed.weights.sender import WeightSender


class FakeEngine:
    """Speaks the engine side of the protocol through an httpx.MockTransport; rejects names starting 'bad'.
    `sessions`: SGLang 0.5.23's rule (weights load only between /begin_weight_update and
    /end_weight_update); False: an older engine, which answers 404 to both."""

    def __init__(self, sessions: bool = True, session_open: bool = False, in_order: bool = False):
        self.calls, self.tensors, self.group, self.version = [], {}, None, None
        self.sessions, self.session_open = sessions, session_open
        # `in_order`: says so in /server_info and loads pipelined buckets by `bucket_index`, as the hf engine
        self.in_order, self.next_bucket, self.turn = in_order, 0, None
        self.flushes, self.indices, self.in_flight, self.most_in_flight = [], [], 0, 0

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else {}
        path = request.url.path
        if path == "/server_info":
            return httpx.Response(200, json={"weight_buckets_in_order": self.in_order})
        self.calls.append(path)
        if path == "/update_weights_from_distributed" and "bucket_index" in body:
            return await self._in_turn(body)
        if path in ("/begin_weight_update", "/end_weight_update"):
            if not self.sessions:
                return httpx.Response(404, json={"detail": "Not Found"})
            opening = path == "/begin_weight_update"
            if self.session_open == opening:
                return httpx.Response(400, json={"success": False, "message": "a weight-update session is already "
                                                 "open" if opening else "no weight-update session is open"})
            self.session_open = opening
            return httpx.Response(200, json={"success": True, "message": "Success"})
        if path == "/update_weights_from_distributed" and self.sessions and not self.session_open:
            await asyncio.to_thread(self._receive, body)  # SGLang receives, then refuses to load
            return httpx.Response(400, json={"success": False, "message": "update_weights_from_distributed must run "
                                             "between begin_weight_update() and end_weight_update()"})
        if path == "/init_weights_update_group":
            self.group = await asyncio.to_thread(
                create_weight_group, master_address=body["master_address"], master_port=body["master_port"],
                rank=body["rank_offset"], world_size=body["world_size"], group_name=body["group_name"],
                backend=body["backend"], timeout_s=20)
            return httpx.Response(200, json={"success": True, "message": "joined"})
        if path == "/update_weights_from_distributed":
            if body["names"][0].startswith("early"):  # rejected before receiving: the sender's broadcast dangles
                return httpx.Response(400, json={"error": {"message": "malformed request"}})
            if body["names"][0].startswith("late"):  # replies before its receive ends; the sender must settle
                threading.Timer(0.3, self._receive, args=(body,)).start()
                return httpx.Response(400, json={"success": False, "message": "late reject"})
            received = await asyncio.to_thread(self._receive, body)
            bad = [n for n in body["names"] if n.startswith("bad")]
            if bad:
                return httpx.Response(400, json={"success": False, "message": f"unknown tensors {bad}"})
            self.tensors.update(received)
            self.flushes.append(body["flush_cache"])
            self.version = body.get("weight_version", self.version)
            self.calls[-1] += f"@{body.get('weight_version')}"
            return httpx.Response(200, json={"success": True, "message": "ok"})
        if path == "/destroy_weights_update_group":
            self.group.destroy()
        return httpx.Response(200, json={"success": True, "message": "ok"})

    async def _in_turn(self, body) -> httpx.Response:
        """A pipelined bucket: wait for its turn, receive it, pass the turn on."""
        self.turn = self.turn or asyncio.Condition()
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        async with self.turn:
            await self.turn.wait_for(lambda: self.next_bucket == body["bucket_index"])
        self.indices.append(body["bucket_index"])
        self.tensors.update(await asyncio.to_thread(self._receive, body))
        self.flushes.append(body["flush_cache"])
        self.version = body.get("weight_version", self.version)
        async with self.turn:
            self.next_bucket, self.in_flight = self.next_bucket + 1, self.in_flight - 1
            self.turn.notify_all()
        return httpx.Response(200, json={"success": True, "message": "ok"})

    def _receive(self, body):
        out = {}
        for name, dtype, shape in zip(body["names"], body["dtypes"], body["shapes"]):
            tensor = torch.empty(shape, dtype=getattr(torch, dtype))
            self.group.broadcast(tensor)
            out[name] = tensor
        return out


def _sender(engine: FakeEngine, **kwargs) -> WeightSender:
    return WeightSender(["http://fake:1"], backend="gloo", timeout_s=30, transport=httpx.MockTransport(engine),
                        **kwargs)


def test_push_sends_every_tensor_and_stamps_the_version_on_the_last_bucket():
    engine = FakeEngine()
    state = {"a": torch.randn(4, 4), "b": torch.randn(8).to(torch.bfloat16), "c": torch.randn(2, 3)}

    async def go():
        sender = _sender(engine, bucket_bytes=64)
        await sender.connect()
        stats = await sender.push(state.items(), version=5)
        await sender.close()
        return stats

    stats = asyncio.run(go())
    assert all(torch.equal(engine.tensors[n], t) for n, t in state.items())
    assert engine.version == "5" and stats.num_buckets == 2 and stats.version == 5  # [a] [b, c]
    assert stats.bytes == 64 + 16 + 24
    assert engine.calls == ["/init_weights_update_group", "/pause_generation", "/begin_weight_update",
                            "/update_weights_from_distributed@None", "/update_weights_from_distributed@5",
                            "/end_weight_update", "/continue_generation", "/destroy_weights_update_group"]
    assert engine.flushes == [False, True]  # no /flush_cache round trip: the last bucket flushes


def test_buckets_are_pipelined_to_receivers_that_load_them_in_order():
    """An engine that loads buckets in order (the hf engine's /server_info says so) gets several in
    flight at once, numbered; every tensor lands, the version on the last; an engine that does not
    say so gets one at a time and no `bucket_index` (SGLang would refuse the field)."""
    state = {f"w{i}": torch.full((4,), float(i)) for i in range(6)}  # 16 bytes each: one bucket per tensor

    async def push(engine: FakeEngine) -> int:
        sender = _sender(engine, bucket_bytes=16, pipeline_depth=3)
        await sender.connect()
        stats = await sender.push(state.items(), version=7)
        await sender.close()
        return sender.depth, stats.num_buckets

    ordered = FakeEngine(in_order=True)
    assert asyncio.run(push(ordered)) == (3, 6)
    assert ordered.indices == list(range(6)) and ordered.most_in_flight > 1 and ordered.flushes[-1]
    assert all(torch.equal(ordered.tensors[n], t) for n, t in state.items()) and ordered.version == "7"
    plain = FakeEngine()
    assert asyncio.run(push(plain)) == (1, 6)
    assert not plain.indices and all(torch.equal(plain.tensors[n], t) for n, t in state.items())


@pytest.mark.parametrize("engine", [FakeEngine(sessions=False), FakeEngine(session_open=True)],
                         ids=["engine-without-sessions", "session-left-open"])
def test_an_engine_without_sessions_or_with_one_left_open_still_takes_the_weights(engine):
    async def go():
        sender = _sender(engine)
        await sender.connect()
        await sender.push([("a", torch.ones(2))], version=2)
        await sender.close()

    asyncio.run(go())
    assert engine.version == "2" and torch.equal(engine.tensors["a"], torch.ones(2))
    assert not engine.session_open


def test_rejected_bucket_raises_engine_message_quickly_and_resumes_generation():
    engine = FakeEngine()

    async def go():
        sender = _sender(engine)
        await sender.connect()
        start = time.monotonic()
        with pytest.raises(WeightSyncError) as info:
            await sender.push([("ok", torch.ones(2)), ("bad.weight", torch.ones(3))], version=1)
        elapsed = time.monotonic() - start
        await sender.close()
        return info.value, elapsed

    error, elapsed = asyncio.run(go())
    assert "unknown tensors ['bad.weight']" in str(error) and "http://fake:1" in str(error)
    assert elapsed < 5
    assert engine.version is None
    assert "/continue_generation" in engine.calls
    assert not engine.session_open  # closed after the failure: the next push can open one


def test_push_before_connect_is_an_error():
    with pytest.raises(WeightSyncError, match="connect"):
        asyncio.run(_sender(FakeEngine()).push([("a", torch.ones(1))], version=1))


def test_engine_rejecting_before_receive_raises_and_marks_the_group_broken():
    engine = FakeEngine()

    async def go():
        sender = _sender(engine)
        await sender.connect()
        start = time.monotonic()
        with pytest.raises(WeightSyncError, match="malformed request"):
            await sender.push([("early", torch.ones(64, 1024))], version=1)
        elapsed = time.monotonic() - start
        with pytest.raises(WeightSyncError, match="broken"):
            await sender.push([("ok", torch.ones(2))], version=2)
        await sender.close()
        return elapsed

    assert asyncio.run(go()) < 5


def test_rejection_arriving_before_the_broadcast_ends_still_keeps_the_group_usable():
    engine = FakeEngine()

    async def go():
        sender = _sender(engine)
        await sender.connect()
        with pytest.raises(WeightSyncError, match="late reject"):
            await sender.push([("late", torch.ones(1024, 1024))], version=1)  # 4 MiB: the send blocks
        stats = await sender.push([("ok", torch.full((3,), 2.0))], version=2)
        await sender.close()
        return stats

    assert asyncio.run(go()).version == 2
    assert torch.equal(engine.tensors["ok"], torch.full((3,), 2.0)) and engine.version == "2"


def test_close_destroys_the_local_group_while_the_engines_destroy_theirs():
    """An NCCL group's shutdown waits for every rank's; an engine that answers its destroy only
    once the sender destroyed its own side must not stall close() (it did, for 30 s, on GPUs)."""
    engine, local_destroyed = FakeEngine(), threading.Event()

    class WaitingEngine(FakeEngine):
        async def __call__(self, request):
            if request.url.path == "/destroy_weights_update_group":
                engine.waited = await asyncio.to_thread(local_destroyed.wait, 5.0)
            return await FakeEngine.__call__(engine, request)

    async def go():
        sender = _sender(WaitingEngine())
        await sender.connect()
        group = sender._group
        real_destroy = group.destroy
        group.destroy = lambda: (local_destroyed.set(), real_destroy())
        start = time.monotonic()
        await sender.close()
        return time.monotonic() - start

    elapsed = asyncio.run(go())
    assert engine.waited and elapsed < 3, elapsed


def test_a_local_shutdown_that_never_returns_does_not_stall_close(monkeypatch, caplog):
    """A gloo group's shutdown can block with a peer gone mid-close; the close is bounded like the
    engines' answers, logged, and the sender can connect again (a topology change goes on)."""
    monkeypatch.setattr("relax.distributed.weights.sender.CLOSE_TIMEOUT_S", 0.5)
    stuck = threading.Event()

    async def go():
        sender = _sender(FakeEngine())
        await sender.connect()
        real_destroy = sender._group.destroy
        sender._group.destroy = lambda: (stuck.wait(10.0), real_destroy())
        start = time.monotonic()
        await sender.close()
        elapsed = time.monotonic() - start
        stuck.set()
        await sender.connect()
        await sender.close()
        return elapsed

    elapsed = asyncio.run(go())
    assert elapsed < 3, elapsed
    assert "destroy_weights_update_group on this rank failed: TimeoutError" in caplog.text


def test_receivers_on_the_senders_gpu_get_ipc_payloads_and_the_others_the_broadcast():
    """The split only (CUDA IPC itself needs a GPU: tests/unit/backends/hf/test_hf_gpu.py and the GPU runs):
    the colocated receiver never joins the group and gets one payload per tensor-parallel rank."""
    engine, colocated = FakeEngine(), []

    async def route(request: httpx.Request) -> httpx.Response:
        if request.url.host == "colocated":
            colocated.append((request.url.path, json.loads(request.content) if request.content else {}))
            return httpx.Response(200, json={"success": True, "message": "ok"})
        return await engine(request)

    async def go():
        sender = WeightSender(["http://colocated:1", "http://fake:1"], backend="gloo", timeout_s=30,
                              transport=httpx.MockTransport(route), ipc_ranks=[2, 0])
        await sender.connect()
        await sender.push([("a", torch.ones(2))], version=3)
        await sender.close()

    asyncio.run(go())
    paths = [path for path, _ in colocated]
    assert paths == ["/server_info", "/pause_generation", "/begin_weight_update", "/update_weights_from_tensor",
                     "/end_weight_update", "/continue_generation"]
    body = colocated[3][1]
    assert len(body["serialized_named_tensors"]) == 2 and body["weight_version"] == "3" and body["flush_cache"]
    assert body["load_format"] == "flattened_bucket"  # one IPC handle per bucket (relax/distributed/weights/ipc.py)
    assert engine.calls[0] == "/init_weights_update_group" and torch.equal(engine.tensors["a"], torch.ones(2))


class ReceiverEndpoint:
    """A real `WeightReceiver` (the hf engine's and the training ranks' loading code) behind the
    sender's receiver interface, taking the extensions `features` names; records each call's
    path with when it started and ended, and the broadcasts its group received."""

    def __init__(self, model: torch.nn.Module, features: frozenset[str]):
        from relax.distributed.weights.receiver import WeightReceiver

        self.receiver, self._features = WeightReceiver(model, timeout_s=20), features
        self.spans: list[tuple[str, float, float]] = []
        self.broadcasts = 0
        self.turn = asyncio.Lock()  # buckets load one at a time, in the order posted (FIFO), as the hf engine's

    async def features(self) -> frozenset[str]:
        return self._features

    async def post(self, path: str, payload: dict, timeout_s: float) -> dict:
        start = time.monotonic()
        if path == "/init_weights_update_group":
            await asyncio.to_thread(self.receiver.init_group, **payload)
            group = self.receiver.groups[payload["group_name"]]
            broadcast = group.broadcast

            def counted(tensor, src=0):
                self.broadcasts += 1
                broadcast(tensor, src)
            group.broadcast = counted
        elif path == "/update_weights_from_distributed":
            async with self.turn:
                success, message = await asyncio.to_thread(self.receiver.update, payload)
            assert success, message
        elif path in ("/pause_generation", "/begin_weight_update", "/end_weight_update", "/continue_generation"):
            await asyncio.sleep(0.05)  # a round trip
        elif path == "/destroy_weights_update_group":
            self.receiver.destroy_group(payload["group_name"])
        self.spans.append((path, start, time.monotonic()))
        return {"success": True, "message": "ok"}

    def span(self, path: str) -> tuple[float, float]:
        return next((s, e) for p, s, e in self.spans if p == path)


@pytest.mark.parametrize("flat", [True, False], ids=["flat", "per-tensor"])
def test_receivers_that_take_flat_buckets_get_one_broadcast_per_bucket_and_overlapped_control_calls(flat):
    """Relax's receivers (the hf engine, training ranks) take each bucket as one broadcast of its
    bytes, every dtype and a non-contiguous source included, and their pause and session calls
    overlap (pause with begin, end with continue); a receiver without the flat extension gets one
    broadcast per tensor."""
    from relax.distributed.weights.endpoints import FLAT, IN_ORDER

    model = torch.nn.Module()
    model.a = torch.nn.Parameter(torch.zeros(3, 5))
    model.b = torch.nn.Parameter(torch.zeros(7, dtype=torch.bfloat16))
    model.register_buffer("c", torch.zeros(2, 2, dtype=torch.int64))
    model.d = torch.nn.Parameter(torch.zeros(4, 3))
    state = {"a": torch.randn(3, 5), "b": torch.randn(7).to(torch.bfloat16), "c": torch.tensor([[1, 2], [3, 4]]),
             "d": torch.randn(3, 4).t()}  # (non-contiguous)
    endpoint = ReceiverEndpoint(model, frozenset({IN_ORDER, FLAT} if flat else {IN_ORDER}))

    async def go():
        sender = WeightSender([endpoint], backend="gloo", timeout_s=30, bucket_bytes=96)
        await sender.connect()
        stats = await sender.push(state.items(), version=3)
        await sender.close()
        return stats

    stats = asyncio.run(go())
    assert all(torch.equal(getattr(model, n), t) for n, t in state.items()) and endpoint.receiver.version == "3"
    assert stats.num_buckets == 2  # [a (60 bytes), b (14)] [c (32), d (48)]
    assert endpoint.broadcasts == (2 if flat else 4)
    pause, begin = endpoint.span("/pause_generation"), endpoint.span("/begin_weight_update")
    end, resume = endpoint.span("/end_weight_update"), endpoint.span("/continue_generation")
    assert begin[0] < pause[1] and resume[0] < end[1]  # in flight together: one round trip each side
    first_bucket = endpoint.span("/update_weights_from_distributed")
    assert first_bucket[0] >= pause[1]  # no bucket loads before the engines are paused
