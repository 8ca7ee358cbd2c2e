"""The weight-update group: a broadcast group beside torch.distributed's default one, and where
it listens: loopback while every engine is on this host; this host's address towards an engine on
another host (an external engine), which could not reach loopback; a clear error naming the engine
and the variable that sets the address when no route reaches it."""

from __future__ import annotations

import socket
import threading

import psutil
import pytest
import torch
import torch.distributed as dist

from relax.distributed.store import BIND_ENV, address_towards, is_loopback
from relax.distributed.weights.group import create_weight_group, group_master_address
from relax.distributed.weights.protocol import WeightSyncError
from relax.utils.net import free_port


def lan_address() -> str | None:
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family == socket.AF_INET and not is_loopback(a.address):
                return a.address
    return None


def test_engines_on_this_host_keep_the_group_on_loopback(monkeypatch):
    monkeypatch.delenv(BIND_ENV, raising=False)
    urls = ["http://127.0.0.1:30000", "http://localhost:30001", object()]  # object: a Ray receiver endpoint
    assert group_master_address("127.0.0.1", urls) == "127.0.0.1"


def test_an_engine_on_another_host_gets_an_address_it_can_reach(monkeypatch):
    lan = lan_address()
    if lan is None:
        pytest.skip("this machine has no non-loopback IPv4 address")
    monkeypatch.delenv(BIND_ENV, raising=False)
    assert group_master_address("127.0.0.1", ["http://127.0.0.1:1", f"http://{lan}:30000"]) == lan
    assert address_towards(lan) == lan and address_towards("127.0.0.1") == "127.0.0.1"
    monkeypatch.setenv(BIND_ENV, "10.1.2.3")  # the run's bind address wins when it is not loopback
    assert group_master_address("127.0.0.1", [f"http://{lan}:30000"]) == "10.1.2.3"
    assert group_master_address("10.9.9.9", [f"http://{lan}:30000"]) == "10.9.9.9"  # an explicit address stays


def test_an_engine_no_route_reaches_is_named_with_the_fix(monkeypatch):
    lan = lan_address()
    if lan is None:
        pytest.skip("this machine has no non-loopback IPv4 address")
    monkeypatch.delenv(BIND_ENV, raising=False)

    def unreachable(peer: str) -> str:
        raise OSError(101, "Network is unreachable")

    monkeypatch.setattr("relax.distributed.weights.group.address_towards", unreachable)
    with pytest.raises(WeightSyncError, match=f"engine at {lan} can reach it.*Network is unreachable.*\\${BIND_ENV}"):
        group_master_address("127.0.0.1", [f"http://{lan}:30000"])
    # A name that does not resolve keeps loopback: the engine's HTTP call fails naming it.
    assert group_master_address("127.0.0.1", ["http://no-such-host.invalid:30000"]) == "127.0.0.1"


def test_weight_group_broadcasts_without_touching_the_default_group():
    port, groups = free_port(), {}

    def join(rank):
        groups[rank] = create_weight_group(master_address="127.0.0.1", master_port=port, rank=rank, world_size=3,
                                           group_name="g", backend="gloo", timeout_s=20)

    threads = [threading.Thread(target=join, args=(r,)) for r in range(3)]
    [t.start() for t in threads]
    [t.join(30) for t in threads]
    sent = torch.arange(12, dtype=torch.bfloat16).reshape(3, 4)
    received = {r: torch.zeros(3, 4, dtype=torch.bfloat16) for r in (1, 2)}
    threads = [threading.Thread(target=groups[r].broadcast, args=(received[r],)) for r in (1, 2)]
    [t.start() for t in threads]
    groups[0].broadcast(sent)
    [t.join(30) for t in threads]
    assert all(torch.equal(received[r], sent) for r in (1, 2))
    assert not dist.is_initialized()
    for group in groups.values():
        group.destroy()
