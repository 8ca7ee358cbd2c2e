"""What the hf engine keeps from one armed push to the next (relax/distributed/weights/armed.py), over
HTTP to an in-process engine (ASGI transport, gloo group in this process): its walk of the model,
forgotten when memory is released or resumed, and each push's layout by `layout_id`, so an unchanged
layout is armed by id alone, a forgotten one is sent again, and an id that disagrees is refused."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest
import torch

from relax.backends.hf.engine import HFEngine
from relax.backends.hf.server import create_app
from relax.distributed.weights.armed import ARM_PATH, END_PATH, arm_payload
from relax.distributed.weights.endpoints import HTTPEndpoint
from relax.distributed.weights.protocol import WeightSyncError
from relax.distributed.weights.sender import WeightSender

URL = "http://127.0.0.1:9"  # (the ASGI transport never dials it; loopback keeps the group on loopback)


class Recorded(httpx.AsyncBaseTransport):
    """The engine's app as the sender's transport, recording each request's path and JSON body."""

    def __init__(self, app) -> None:
        self.inner, self.requests = httpx.ASGITransport(app=app), []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = request.content
        self.requests.append((request.url.path, json.loads(body) if body else None))
        return await self.inner.handle_async_request(request)


@pytest.fixture()
def engine(tiny_model_dir):
    return HFEngine(str(tiny_model_dir))


def _state(model_dir) -> list[tuple[str, torch.Tensor]]:
    from transformers import AutoModelForCausalLM

    return [(n, p.detach().clone()) for n, p in AutoModelForCausalLM.from_pretrained(model_dir).named_parameters()]


def _holds(engine: HFEngine, state: list[tuple[str, torch.Tensor]]) -> bool:
    params = dict(engine.model.named_parameters())
    return all(torch.equal(params[n], t) for n, t in state)


def _replace_tensors(model: torch.nn.Module) -> None:
    """Every parameter and buffer of `model` a new tensor object with the same values (ties kept), as
    a move to another device may make them (`model.to()` of buffers; parameters under
    torch.__future__.set_overwrite_module_params_on_conversion)."""
    made: dict[int, torch.Tensor] = {}
    for module in model.modules():
        for table in (module._parameters, module._buffers):
            for name, t in table.items():
                if t is not None and id(t) not in made:
                    made[id(t)] = (torch.nn.Parameter(t.detach().clone(), requires_grad=t.requires_grad)
                                   if isinstance(t, torch.nn.Parameter) else t.clone())
                if t is not None:
                    table[name] = made[id(t)]


async def _push_all(engine: HFEngine, states: list, between=None) -> tuple[list, Recorded]:
    """One sender, one armed push of each state in turn (`between(i)` awaited before push i > 0)."""
    wire = Recorded(create_app(engine))
    sender = WeightSender([HTTPEndpoint(URL, transport=wire)], backend="gloo", bucket_bytes=8 << 10, timeout_s=60)
    await sender.connect()
    pushes = []
    try:
        for i, state in enumerate(states):
            if i and between is not None:
                await between(i)
            wire.requests.clear()
            stats = await sender.push(state, version=i + 1)
            pushes.append((stats, list(wire.requests)))
    finally:
        await sender.close()
    return pushes, wire


def test_a_push_after_release_and_resume_writes_the_models_tensors_and_two_pushes_walk_once(
        engine, tiny_model_dir, other_tiny_model_dir, monkeypatch):
    """The engine keeps its model walk across pushes (one walk for two); release and resume forget it.
    On this CPU nothing moves, so the release replaces the model's tensors itself where the CUDA
    engine's `model.to()` does (under the step lock, with the cache released): a kept walk would write
    the push into the old tensors and the model would keep the first push's values."""
    walks, walk = [], engine.receiver._targets
    monkeypatch.setattr(engine.receiver, "_targets", lambda: (walks.append(1), walk())[1])
    release_cache = engine.decoder.release_cache
    monkeypatch.setattr(engine.decoder, "release_cache",
                        lambda: (release_cache(), _replace_tensors(engine.model)))
    first, other = _state(other_tiny_model_dir), _state(tiny_model_dir)
    seen = []

    async def between(i):
        seen.append((len(walks), _holds(engine, first)))
        if i == 2:
            await engine.release_memory(None)
            await engine.resume_memory(None)

    pushes, _ = asyncio.run(_push_all(engine, [first, first, other], between))
    assert [p[0].num_buckets > 1 for p in pushes] == [True] * 3
    assert seen == [(1, True), (1, True)]  # two pushes, one walk
    assert _holds(engine, other)  # the model's tensors as they are now were written, not the replaced ones
    assert len(walks) == 2  # (walked anew after the release)
    assert engine.weight_version == "3"


def test_an_unchanged_layout_goes_by_id_and_a_forgotten_one_is_sent_again(engine, tiny_model_dir,
                                                                          other_tiny_model_dir):
    """Push 2 (same layout) arms with the layout_id and no buckets, ahead of its buckets (with their flat
    lengths); before push 3 the engine forgets its layouts (as a restarted one): its arm by id, ahead, is
    refused with 409 having paused nothing, the engine drains the buckets already on their way, and the
    sender arms it with the buckets (no longer ahead), broadcasts them again, and the push lands."""
    states = [_state(tiny_model_dir), _state(other_tiny_model_dir), _state(tiny_model_dir)]
    paused = []

    async def between(i):
        if i == 2:
            engine.receiver.layouts.clear()
            pause = engine.scheduler.pause
            engine.scheduler.pause = lambda mode: (paused.append(mode), pause(mode))[1]

    pushes, _ = asyncio.run(_push_all(engine, states, between))
    (_, first), (_, second), (stats, third) = pushes
    assert [p for p, _ in first] == [ARM_PATH, END_PATH] and first[0][1]["buckets"]
    assert [p for p, _ in second] == [ARM_PATH, END_PATH] and "buckets" not in second[0][1]
    assert second[0][1]["layout_id"] == first[0][1]["layout_id"]
    assert "ahead" not in first[0][1] and second[0][1]["ahead"] is True
    assert second[0][1]["bytes"] == [b["bytes"] for b in first[0][1]["buckets"]]
    assert len(json.dumps(second[0][1])) < len(json.dumps(first[0][1])) // 5
    assert [p for p, _ in third] == [ARM_PATH, ARM_PATH, END_PATH]
    assert "buckets" not in third[0][1] and third[0][1]["ahead"] is True
    assert third[1][1]["buckets"] == first[0][1]["buckets"] and "ahead" not in third[1][1]
    drained = engine.receiver.draining.future.result()
    assert drained.startswith(f"drained {len(first[0][1]['buckets'])} buckets of a refused push") and \
        "does not hold it" in drained
    assert paused == ["abort"]  # the refused arm paused nothing
    assert _holds(engine, states[2]) and engine.weight_version == "3" and stats.num_buckets > 1


def test_an_arm_whose_layout_id_disagrees_with_its_buckets_or_is_unknown_is_refused_before_the_pause(engine):
    """400 for a layout_id that is not its buckets' digest, 409 for an unknown one sent alone; neither
    pauses generation, opens a session or keeps the layout. A group is joined so only the layout fails."""
    names = [(n, p.detach()) for n, p in engine.model.named_parameters()][:3]
    payload = arm_payload([names], group_name="g", flat=True, weight_version="1", pause_mode="abort")
    other = arm_payload([names[:2]], group_name="g", flat=True, weight_version="1", pause_mode="abort")
    engine.receiver.groups["g"] = object()  # (looked up, never received on: every arm here is refused)

    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(engine)), base_url=URL) as client:
            mismatched = await client.post(ARM_PATH, json={**payload, "layout_id": other["layout_id"]})
            unknown = await client.post(ARM_PATH, json={k: v for k, v in payload.items() if k != "buckets"})
        return mismatched, unknown

    mismatched, unknown = asyncio.run(go())
    assert mismatched.status_code == 400 and "does not match the buckets sent with it" in mismatched.text
    assert unknown.status_code == 409 and "does not hold it" in unknown.text
    assert engine.scheduler.paused_mode is None and not engine.weight_session_open and engine.receiver.armed is None
    assert engine.receiver.layouts.get(other["layout_id"]) is None and engine.receiver.layouts.get(
        payload["layout_id"]) is None


def test_a_refused_arm_ahead_drains_the_bytes_it_stated_and_the_group_stays_in_step(engine, tiny_model_dir):
    """An arm ahead whose `bytes` disagree with the layout it names is refused (400, `success: false`) and the
    engine drains what the arm stated, while rank 0 broadcasts exactly that; a push after it lands."""
    state = _state(tiny_model_dir)

    async def go():
        wire = Recorded(create_app(engine))
        sender = WeightSender([HTTPEndpoint(URL, transport=wire)], backend="gloo", bucket_bytes=8 << 10, timeout_s=60)
        await sender.connect()
        try:
            await sender.push(state, version=1)
            arm = {k: v for k, v in next(b for p, b in wire.requests if p == ARM_PATH).items() if k != "buckets"}
            sizes = [16, 4096]  # (not the layout's)
            group = sender._group
            sent = asyncio.to_thread(lambda: [group.broadcast(torch.ones(n, dtype=torch.uint8)) for n in sizes])
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(engine)), base_url=URL) as c:
                reply = await c.post(ARM_PATH, json={**arm, "ahead": True, "bytes": sizes})
            await sent
            drained = await asyncio.wrap_future(engine.receiver.draining.future)
            stats = await sender.push(state, version=2)
        finally:
            await sender.close()
        return reply, drained, stats

    reply, drained, stats = asyncio.run(go())
    assert reply.status_code == 400 and reply.json()["success"] is False
    assert "do not match the layout's buckets" in reply.json()["message"] and "drained" in reply.json()["message"]
    assert drained.startswith("drained 2 buckets of a refused push")
    assert stats.version == 2 and engine.weight_version == "2" and _holds(engine, state)
    assert not engine.weight_session_open and engine.scheduler.paused_mode is None


def test_an_arm_ahead_that_cannot_drain_fails_the_push_and_a_new_group_takes_the_next(engine, tiny_model_dir,
                                                                                     other_tiny_model_dir):
    """The engine's group is out of step (quarantined) when an arm ahead comes: it cannot drain there and
    answers 400 without `success`; the push fails at once naming it, the group is marked broken, and after
    close and connect (a new group) the next push lands."""
    first, second = _state(tiny_model_dir), _state(other_tiny_model_dir)

    async def go():
        wire = Recorded(create_app(engine))
        sender = WeightSender([HTTPEndpoint(URL, transport=wire)], backend="gloo", bucket_bytes=8 << 10, timeout_s=5)
        await sender.connect()
        try:
            await sender.push(first, version=1)
            engine.receiver.quarantine(sender.group_name)
            start, wire.requests[:] = time.monotonic(), []
            with pytest.raises(WeightSyncError) as info:
                await sender.push(second, version=2)
            seconds, broken = time.monotonic() - start, sender._broken
            # (no end call: it was not armed; the failed push resumes generation)
            assert [(p, (b or {}).get("ahead")) for p, b in wire.requests] == [(ARM_PATH, True),
                                                                                ("/continue_generation", None)]
            await sender.close()
            await sender.connect()
            stats = await sender.push(second, version=3)
        finally:
            await sender.close()
        return str(info.value), seconds, broken, stats

    message, seconds, broken, stats = asyncio.run(go())
    assert "is out of step" in message
    assert broken and seconds < 4  # (not the broadcast's timeout)
    assert stats.version == 3 and engine.weight_version == "3" and _holds(engine, second)
