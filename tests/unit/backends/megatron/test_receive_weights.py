"""A megatron rank takes a weight push (fully async ActorFwd) and then computes what an fsdp rank
computes from the same weights (fp32, gloo, the real sender and protocol).

Each case starts a megatron rank from a tiny checkpoint, pushes it other HF weights through
`WeightSender` -> `RayEndpoint` -> `receive_weights` in buckets small enough that q/k/v and
gate/up land in different buckets, and compares its log-probs with an fsdp rank's loaded from a
checkpoint of the pushed weights. A bucket that does not fit the model is refused whole, and a
push that leaves a fused tensor incomplete is refused without taking its version."""

from __future__ import annotations

import dataclasses

import asyncio
import os
import shutil
import socket
import sys
from concurrent.futures import Future, ThreadPoolExecutor

import pytest

pytest.importorskip("megatron.core")
sys.path.insert(0, os.path.dirname(__file__))
import parity_cases  # noqa: E402
import torch  # noqa: E402

from relax.backends.base import ModelParallelSpec, TrainerSpec  # noqa: E402
from relax.config.schema import BatchConfig, OptimizerConfig  # noqa: E402
from relax.distributed.weights.endpoints import RayEndpoint  # noqa: E402
from relax.distributed.weights.protocol import BucketRejected, WeightSyncError  # noqa: E402
from relax.distributed.weights.sender import WeightSender  # noqa: E402
from relax.utils.net import free_port, free_ports  # noqa: E402

ATOL_LOGP = 1e-5
BUCKET_BYTES = 3000  # the tiny models' q_proj alone is 4 KiB: fused tensors straddle buckets


class InProcessActor:
    """A Ray actor handle's shape (`handle.receive_weights.remote(...).future()`) for a receiver
    reached from this process (`receive(path, payload)`: a worker here, or a pipe to a rank's
    process): one call at a time, on its own thread, as a Ray actor runs them."""

    def __init__(self, receive) -> None:
        self._receive, self._pool = receive, ThreadPoolExecutor(1)
        self.receive_weights = self  # handle.receive_weights.remote(...)

    def remote(self, path: str, payload: dict) -> "InProcessActor._Ref":
        return self._Ref(self._pool.submit(self._receive, path, payload))

    class _Ref:
        def __init__(self, future: Future) -> None:
            self._future = future

        def future(self) -> Future:
            return self._future


def spec(path: str) -> TrainerSpec:
    return TrainerSpec(backend="megatron", model_path=path, trainable=False, optim=OptimizerConfig(), threads=1,
                       batch=BatchConfig(micro_batch_size=4), model_parallel=ModelParallelSpec(), sync_timeout_s=60)


def perturbed_copy(path: str, out: str) -> dict[str, torch.Tensor]:
    """A checkpoint at `out` with other weights than `path`'s (same config); its HF state."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(path, out)
    g = torch.Generator().manual_seed(7)
    state = {k: v + 0.2 * torch.randn(v.shape, generator=g) for k, v in load_file(f"{out}/model.safetensors").items()}
    save_file(state, f"{out}/model.safetensors", metadata={"format": "pt"})
    return state


def log_probs(backend: str, path: str) -> list[list[float]]:
    from relax.backends.trainer.trainer import Trainer

    worker = Trainer(0, 1, "127.0.0.1", free_port(), dataclasses.replace(spec(path), backend=backend))
    b = parity_cases.batch()
    try:
        return worker.compute_log_probs(b.tokens_RL, b.response_lengths_R)
    finally:
        worker.shutdown()


def assert_close(rows, ref, atol=ATOL_LOGP):
    for got, want in zip(rows, ref):
        assert got == pytest.approx(want, abs=atol)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Per model: the checkpoint the ranks start from, the HF weights pushed to them, and the fsdp
    rank's log-probs on those weights."""
    root = tmp_path_factory.mktemp("receive")
    out = {}
    for model, start in parity_cases.make_models(str(root)).items():
        pushed = perturbed_copy(start, str(root / f"{model}-pushed"))
        out[model] = {"start": start, "pushed": list(pushed.items()),
                      "fsdp": log_probs("fsdp", str(root / f"{model}-pushed"))}
    return out


@pytest.mark.parametrize("model", ["dense", "moe"])  # tied embeddings; untied, experts and a router
def test_megatron_rank_takes_a_push_and_matches_fsdp_on_the_pushed_weights(models, model):
    from relax.backends.trainer.trainer import Trainer

    start, named, want = models[model]["start"], models[model]["pushed"], models[model]["fsdp"]
    worker = Trainer(0, 1, "127.0.0.1", free_port(), spec(start))
    b = parity_cases.batch()
    score = lambda: worker.compute_log_probs(b.tokens_RL, b.response_lengths_R)  # noqa: E731
    loop = asyncio.new_event_loop()
    sender = WeightSender([RayEndpoint(InProcessActor(worker.receive_weights), "actor_fwd[0]")], backend="gloo",
                          bucket_bytes=BUCKET_BYTES, timeout_s=60, pause_mode="in_place")
    try:
        before = score()
        assert max(abs(x - y) for r, w in zip(before, want) for x, y in zip(r, w)) > 1e-2  # the push must matter
        loop.run_until_complete(sender.connect())
        stats = loop.run_until_complete(sender.push(named, version=3))
        assert stats.num_buckets > 10 and worker.weight_version() == 3
        assert_close(score(), want)

        # A bucket the model cannot take is refused whole: nothing loaded, the group stays usable.
        wrong = [(n, t) for n, t in named if n.endswith("k_proj.weight")][:1]
        bad = [(wrong[0][0], torch.zeros(3, 3)), ("model.layers.0.mlp.nope.weight", torch.zeros(2))]
        with pytest.raises(BucketRejected, match="has shape \\[3, 3\\].*not a weight of the model"):
            loop.run_until_complete(sender.push(bad, version=4))
        # A push that ends with a fused tensor incomplete (v_proj missing) is refused; the version stays.
        partial = [(n, t) for n, t in named if not n.endswith("v_proj.weight")]
        with pytest.raises(WeightSyncError, match="v_proj.weight.*incomplete"):
            loop.run_until_complete(sender.push(partial, version=5))
        assert worker.weight_version() == 3
    finally:
        loop.run_until_complete(sender.close())
        loop.close()
        worker.shutdown()


def test_sharded_megatron_ranks_keep_their_shards_of_a_push(models, rank_pool, tmp_path):
    """Two ranks, TP=2 (dense: vocabulary, q/k/v groups and gate/up split), PP=2 (dense: the tied
    embedding's copy on the last stage) and EP=2 (MoE: two experts each), receiving in one
    broadcast group, then scoring: fsdp's log-probs on the pushed weights."""
    from multiprocessing.connection import Listener

    cases = [("dense", {"tp": 2}), ("dense", {"pp": 2}), ("moe", {"ep": 2})]
    port = free_ports(len(cases))
    previous = socket.getdefaulttimeout()
    socket.setdefaulttimeout(120)  # the listening socket's: a rank that never connects fails the test
    try:
        listener = Listener(str(tmp_path / "ranks.sock"), authkey=b"receive-weights")
    finally:
        socket.setdefaulttimeout(previous)
    job = rank_pool.submit(parity_cases.serve_receiver, [
        (r, 2, port, [(models[m]["start"], p) for m, p in cases], listener.address, b"receive-weights")
        for r in range(2)], "the sharded receiving ranks")
    accepted = [listener.accept() for _ in range(2)]
    listener.close()
    conns = sorted(accepted, key=lambda c: c.recv())  # each rank says which it is

    def call(conn, msg):
        conn.send(msg)
        return conn.recv()

    loop = asyncio.new_event_loop()
    try:
        for version, (model, _) in enumerate(cases, start=1):
            endpoints = [RayEndpoint(InProcessActor(lambda path, payload, c=c: call(c, ("call", path, payload))),
                                     f"actor_fwd[{r}]") for r, c in enumerate(conns)]
            sender = WeightSender(endpoints, backend="gloo", bucket_bytes=BUCKET_BYTES, timeout_s=60,
                                  pause_mode="in_place")
            loop.run_until_complete(sender.connect())
            loop.run_until_complete(sender.push(models[model]["pushed"], version=version))
            loop.run_until_complete(sender.close())
            for c in conns:  # scoring is a collective over the two ranks: ask both, then read
                c.send(("score",))
            answers = [c.recv() for c in conns]
            # one answer per data-parallel shard (EP=2 on two ranks: two shards, each scoring every row)
            assert [info["output"] for info, _ in answers].count(True) == answers[0][0]["dp_size"]
            for info, rows in answers:
                if info["output"]:
                    assert_close(rows, models[model]["fsdp"])
            for c in conns:
                c.send(("next",))
    finally:
        loop.close()
        for c in conns:
            c.close()  # a rank still waiting for a message (a failed case) stops with EOFError
        rank_pool.wait(job, 60)
