"""Relax's armed push (armed.py): the layout check, and WeightSender against real WeightReceivers
behind in-process endpoints armed as the hf engine is (its HTTP side: tests/unit/backends/hf/test_hf_armed_push.py)."""

from __future__ import annotations

import asyncio
import time

import pytest
import torch

from relax.distributed.weights.armed import (
    ARM_PATH, END_PATH, LAYOUTS_KEPT, ArmLayout, Layouts, arm_payload, layout_digest, parse_plan, spec_rows,
)
from relax.distributed.weights.endpoints import ARMED, FLAT, IN_ORDER
from relax.distributed.weights.group import WeightGroup
from relax.distributed.weights.protocol import BucketRejected, LayoutUnknown, WeightSyncError
from relax.distributed.weights.receiver import WeightReceiver
from relax.distributed.weights.sender import WeightSender


class ArmedEndpoint:
    """A real `WeightReceiver` as the sender's receiver, answering the armed push the way the hf
    engine's routes do (weight_session.py, without HTTP); `paths` records every call of a push."""

    def __init__(self, receiver: WeightReceiver, features: frozenset[str] = frozenset({IN_ORDER, FLAT, ARMED})):
        self.receiver, self._features, self.paths, self.arms = receiver, features, [], []

    async def features(self) -> frozenset[str]:
        return self._features

    async def post(self, path: str, payload: dict, timeout_s: float) -> dict:
        self.paths.append(path)
        if path == ARM_PATH:
            self.arms.append(dict(payload))
        receiver = self.receiver
        if path == "/init_weights_update_group":
            self.turn = asyncio.Lock()  # per-bucket requests load one at a time, in the order posted
            await asyncio.to_thread(receiver.init_group, **payload)
        elif path == ARM_PATH:
            receiver.arm(payload)
        elif path == END_PATH and receiver.armed is not None:
            outcome = await asyncio.wrap_future(receiver.armed.future)
            receiver.armed = None
            receiver.close_session()
            if not outcome.success:
                raise (BucketRejected if outcome.received else WeightSyncError)(f"{path}: {outcome.message}")
        elif path == "/update_weights_from_distributed":
            async with self.turn:
                success, message = await asyncio.to_thread(receiver.update, payload)
            if not success:
                raise BucketRejected(message)
        elif path == "/destroy_weights_update_group":
            receiver.destroy_group(payload["group_name"])
        return {"success": True, "message": "ok"}


def on_send(monkeypatch, record) -> None:
    """Call `record()` as rank 0 of any weight group in this process broadcasts (the receivers here share it)."""
    broadcast = WeightGroup.broadcast

    def recorded(self, tensor, src=0):
        if self.rank == src:
            record()
        return broadcast(self, tensor, src)

    monkeypatch.setattr(WeightGroup, "broadcast", recorded)


def _model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 4))


def _new_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: torch.randn_like(t) for name, t in model.state_dict().items()}


def _push(endpoints: list, state, *, bucket_bytes: int = 200, version: int = 1, repeats: int = 1,
          timeout_s: float = 30) -> tuple[WeightSender, list]:
    async def go():
        sender = WeightSender(endpoints, backend="gloo", timeout_s=timeout_s, bucket_bytes=bucket_bytes)
        await sender.connect()
        outcomes = []
        try:
            for i in range(repeats):
                for e in endpoints:
                    e.paths.clear()
                    e.arms.clear()
                try:
                    outcomes.append(await sender.push(list(state.items()), version=version + i))
                except WeightSyncError as exc:
                    outcomes.append(exc)
                for e in endpoints:
                    e.pushed, e.pushed_arms = list(e.paths), list(e.arms)  # the last push's calls
        finally:
            await sender.close()
        return sender, outcomes

    return asyncio.run(go())


def test_arm_payload_round_trips_and_a_layout_that_disagrees_is_refused():
    buckets = [[("a", torch.zeros(3, 5)), ("b", torch.zeros(7, dtype=torch.bfloat16))], [("c", torch.zeros(2))]]
    payload = arm_payload(buckets, group_name="g", flat=True, weight_version="4", pause_mode="in_place")
    plan = parse_plan(payload)
    assert [[s.name for s in b] for b in plan.buckets] == [["a", "b"], ["c"]]
    assert plan.flat and plan.weight_version == "4" and payload["buckets"][0]["bytes"] == 256 + 14
    payload["buckets"][1]["bytes"] = 9
    with pytest.raises(ValueError, match="bucket 1: says 9 bytes"):
        parse_plan(payload)
    with pytest.raises(ValueError, match="nothing to update"):
        parse_plan({**payload, "buckets": []})
    with pytest.raises(ValueError, match="load_format='safetensors'"):
        parse_plan({**payload, "load_format": "safetensors"})


def test_an_armed_push_is_two_requests_whatever_its_bucket_count_and_can_be_repeated():
    model = _model()
    endpoint = ArmedEndpoint(WeightReceiver(model, timeout_s=20))
    first, second = _new_state(model), _new_state(model)
    sender, stats = _push([endpoint], first, bucket_bytes=40)  # one bucket per tensor
    assert sender.armed == [endpoint] and stats[0].num_buckets == 4
    assert endpoint.pushed == [ARM_PATH, END_PATH]
    assert all(torch.equal(model.state_dict()[n], t) for n, t in first.items()) and endpoint.receiver.version == "1"
    _, stats = _push([endpoint], second, bucket_bytes=1 << 20, version=5, repeats=2)  # one bucket, pushed twice
    assert [s.num_buckets for s in stats] == [1, 1] and endpoint.pushed == [ARM_PATH, END_PATH]
    assert all(torch.equal(model.state_dict()[n], t) for n, t in second.items()) and endpoint.receiver.version == "6"


def test_a_refused_bucket_surfaces_at_the_end_and_the_group_stays_in_step():
    """A name the model lacks: its bucket is received and dropped, so are the later ones (nothing more
    loads), the version is not taken; the end call says which bucket and why; the next push works."""
    model = _model()
    endpoint = ArmedEndpoint(WeightReceiver(model, timeout_s=20))
    before = {n: t.clone() for n, t in model.state_dict().items()}
    state = {"0.weight": torch.randn(8, 8), "no_such.weight": torch.randn(3), "1.weight": torch.randn(4, 8)}

    async def go():
        sender = WeightSender([endpoint], backend="gloo", timeout_s=30, bucket_bytes=100)
        await sender.connect()
        try:
            with pytest.raises(BucketRejected) as info:
                await sender.push(state.items(), version=2)
            broken = sender._broken
            await sender.push([("1.bias", torch.ones(4))], version=3)  # re-armed on the same group
        finally:
            await sender.close()
        return str(info.value), broken

    message, broken = asyncio.run(go())
    assert END_PATH in message and "bucket 1 of 3" in message and "'no_such.weight' is not a parameter" in message
    assert not broken
    assert torch.equal(model.state_dict()["0.weight"], state["0.weight"])  # bucket 0 was in before the refusal
    assert torch.equal(model.state_dict()["1.weight"], before["1.weight"])  # bucket 2 came after it: dropped
    assert torch.equal(model.state_dict()["1.bias"], torch.ones(4)) and endpoint.receiver.version == "3"


def test_a_load_that_raises_in_the_loop_fails_the_push_at_once_and_breaks_the_group():
    class Failing(WeightReceiver):
        def load(self, specs, tensors):
            if specs[0].name == "1.weight":
                raise RuntimeError("CUDA error: out of memory (injected)")
            super().load(specs, tensors)

    model = _model()
    endpoint = ArmedEndpoint(Failing(model, timeout_s=20))
    start = time.monotonic()
    sender, outcomes = _push([endpoint], _new_state(model), bucket_bytes=40, timeout_s=60)
    elapsed = time.monotonic() - start
    error = outcomes[0]
    assert isinstance(error, WeightSyncError) and not isinstance(error, BucketRejected)
    assert "bucket 2 of 4 failed: RuntimeError: CUDA error: out of memory (injected)" in str(error)
    assert sender._broken and elapsed < 20  # the end call's reply cut the wait short (deadline 60 s)
    assert endpoint.receiver.version is None


def test_a_mixed_fleet_takes_one_push_armed_and_per_bucket():
    armed_model, plain_model = _model(), _model()
    armed = ArmedEndpoint(WeightReceiver(armed_model, timeout_s=20))
    plain = ArmedEndpoint(WeightReceiver(plain_model, timeout_s=20), features=frozenset({IN_ORDER, FLAT}))
    state = _new_state(armed_model)
    sender, stats = _push([armed, plain], state, bucket_bytes=40, repeats=2)
    assert sender.armed == [armed] and sender.flat and [s.num_buckets for s in stats] == [4, 4]
    assert armed.pushed == [ARM_PATH, END_PATH]
    assert plain.pushed.count("/update_weights_from_distributed") == 4 and "/continue_generation" in plain.pushed
    for model in (armed_model, plain_model):
        assert all(torch.equal(model.state_dict()[n], t) for n, t in state.items())
    assert armed.receiver.version == plain.receiver.version == "2"


def test_bucket_0_is_packed_while_the_arm_travels_and_never_sent_when_the_arm_is_refused(monkeypatch):
    """Every receiver armed: bucket 0 is launched before the arm is answered (`WeightSender._ahead`), its
    broadcast held until then. A refused arm (here the receiver lost its group) fails the push, breaks the
    group, and nothing went on the wire: the receiver is not left mid-broadcast."""
    class Refusing(ArmedEndpoint):
        async def post(self, path: str, payload: dict, timeout_s: float) -> dict:
            if path == ARM_PATH and self.refuse:
                self.paths.append(path)
                raise WeightSyncError(f"{path}: arm_weight_update: no weight update group named 'x'")
            return await super().post(path, payload, timeout_s)

    model = _model()
    endpoint = Refusing(WeightReceiver(model, timeout_s=20))
    endpoint.refuse, state, sent = True, _new_state(model), []

    async def go():
        sender = WeightSender([endpoint], backend="gloo", timeout_s=30, bucket_bytes=40)
        await sender.connect()
        on_send(monkeypatch, lambda: sent.append(1))
        try:
            with pytest.raises(WeightSyncError, match="no weight update group"):
                await sender.push(state.items(), version=1)
            broken = sender._broken
            await asyncio.sleep(0.2)  # (bucket 0's thread has seen the refusal)
            await sender.close()
            endpoint.refuse = False
            await sender.connect()
            stats = await sender.push(state.items(), version=2)
        finally:
            await sender.close()
        return broken, stats

    broken, stats = asyncio.run(go())
    assert broken and stats.num_buckets == 4 and len(sent) == 4  # only the second push's buckets went out
    assert all(torch.equal(model.state_dict()[n], t) for n, t in state.items()) and endpoint.receiver.version == "2"


def test_a_layout_id_alone_names_a_kept_layout_and_one_that_disagrees_with_its_buckets_is_refused():
    buckets = [[("a", torch.zeros(3, 5)), ("b", torch.zeros(7, dtype=torch.bfloat16))], [("c", torch.zeros(2))]]
    payload = arm_payload(buckets, group_name="g", flat=True, weight_version="4", pause_mode="abort")
    layouts = Layouts()
    plan = parse_plan(payload, layouts)
    assert plan.layout_id == payload["layout_id"] == layout_digest(spec_rows(plan.buckets))
    short = {k: v for k, v in payload.items() if k != "buckets"}
    assert parse_plan(short, layouts).buckets is plan.buckets  # parsed once
    with pytest.raises(LayoutUnknown, match="does not hold it"):
        parse_plan(short, Layouts())
    with pytest.raises(LayoutUnknown):
        parse_plan(short)
    wrong = arm_payload(buckets[:1], group_name="g", flat=True, weight_version="4", pause_mode="abort")
    with pytest.raises(ValueError, match="does not match the buckets sent with it"):
        parse_plan({**payload, "layout_id": wrong["layout_id"]}, layouts)
    for i in range(LAYOUTS_KEPT):  # newer layouts push the oldest out
        parse_plan(arm_payload([[(f"x{i}", torch.zeros(1))]], group_name="g", flat=True, weight_version="1",
                               pause_mode="abort"), layouts)
    with pytest.raises(LayoutUnknown):
        parse_plan(short, layouts)


def test_a_push_of_an_unchanged_layout_arms_by_id_alone():
    """The second push of the same layout sends its layout_id and no buckets; the receiver loads it from
    the layout it kept. A push of another layout (other bucket boundaries) sends its buckets again."""
    model = _model()
    endpoint = ArmedEndpoint(WeightReceiver(model, timeout_s=20))
    first, second = _new_state(model), _new_state(model)

    async def go():
        sender = WeightSender([endpoint], backend="gloo", timeout_s=30, bucket_bytes=40)
        await sender.connect()
        arms = []
        try:
            for state, bucket_bytes in ((first, 40), (second, 40), (second, 200)):
                sender.bucket_bytes = bucket_bytes
                endpoint.arms.clear()
                await sender.push(list(state.items()), version=len(arms) + 1)
                arms.append(list(endpoint.arms))
        finally:
            await sender.close()
        return arms

    arms = asyncio.run(go())
    assert [len(a) for a in arms] == [1, 1, 1]
    (full,), (short,), (other,) = arms
    assert len(full["buckets"]) == 4 and "buckets" not in short and short["layout_id"] == full["layout_id"]
    assert "buckets" in other and other["layout_id"] != full["layout_id"]
    assert all(torch.equal(model.state_dict()[n], t) for n, t in second.items()) and endpoint.receiver.version == "3"


def test_a_receiver_that_forgot_the_layout_is_sent_it_once_more_before_anything_is_broadcast(monkeypatch):
    """A receiver that no longer holds the layout (a restarted engine) refuses the arm by id
    (LayoutUnknown, 409 over HTTP) having armed nothing; the sender arms it again with the buckets and
    only then broadcasts: the push succeeds and no bucket went out before the arm was accepted."""
    model = _model()
    endpoint = ArmedEndpoint(WeightReceiver(model, timeout_s=20))
    first, second = _new_state(model), _new_state(model)
    events = []

    async def go():
        sender = WeightSender([endpoint], backend="gloo", timeout_s=30, bucket_bytes=40)
        await sender.connect()
        post = endpoint.post
        on_send(monkeypatch, lambda: events.append("broadcast"))

        async def recorded(path, payload, timeout_s):
            events.append((path, "buckets" in payload))
            return await post(path, payload, timeout_s)

        endpoint.post = recorded
        try:
            await sender.push(list(first.items()), version=1)
            endpoint.receiver.layouts.clear()  # as a restarted engine
            events.clear()
            stats = await sender.push(list(second.items()), version=2)
        finally:
            await sender.close()
        return stats

    stats = asyncio.run(go())
    assert events[:2] == [(ARM_PATH, False), (ARM_PATH, True)]  # refused by id, then armed in full
    assert events.count("broadcast") == stats.num_buckets == 4 and events.index("broadcast") > 1
    assert all(torch.equal(model.state_dict()[n], t) for n, t in second.items()) and endpoint.receiver.version == "2"


def test_a_layout_id_that_does_not_match_the_buckets_is_refused_and_nothing_is_broadcast(monkeypatch):
    model = _model()
    endpoint = ArmedEndpoint(WeightReceiver(model, timeout_s=20))
    before = {n: t.clone() for n, t in model.state_dict().items()}
    sent = []

    async def go():
        sender = WeightSender([endpoint], backend="gloo", timeout_s=30, bucket_bytes=40)
        await sender.connect()
        layout = sender._layouts.layout
        on_send(monkeypatch, lambda: sent.append(1))
        sender._layouts.layout = lambda buckets: ArmLayout("0" * 64, layout(buckets).buckets)
        try:
            with pytest.raises(WeightSyncError, match="does not match the buckets sent with it"):
                await sender.push(_new_state(model).items(), version=1)
            await asyncio.sleep(0.2)  # (bucket 0's thread has seen the refusal)
            return sender._broken
        finally:
            await sender.close()

    assert asyncio.run(go()) and sent == []
    assert all(torch.equal(model.state_dict()[n], t) for n, t in before.items()) and endpoint.receiver.armed is None


def test_a_kept_walk_walks_the_model_once_for_two_armed_pushes():
    class Counting(WeightReceiver):
        walks = 0

        def _targets(self):
            self.walks += 1
            return super()._targets()

    model = _model()
    kept, plain = ArmedEndpoint(Counting(model, timeout_s=20, cache_walk=True)), ArmedEndpoint(Counting(model))
    for endpoint in (kept, plain):
        _, stats = _push([endpoint], _new_state(model), bucket_bytes=40, repeats=2)
        assert [s.num_buckets for s in stats] == [4, 4]
    assert kept.receiver.walks == 1 and plain.receiver.walks == 2
