"""Rendezvous stores and gloo groups listen on the group's address only (not every interface, as
torch's TCPStore does by default), and a store's port is held from the moment it is published."""

from __future__ import annotations

import datetime
import os
import subprocess
import sys

import psutil
import pytest

from relax.distributed.store import interface_of, listen, tcp_store

TIMEOUT = datetime.timedelta(seconds=10)


def listening_addresses() -> set[tuple[str, int]]:
    return {(c.laddr.ip, c.laddr.port) for c in psutil.Process().net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN}


def test_the_store_listens_on_its_host_only_and_clients_reach_it():
    before = listening_addresses()
    master = tcp_store("127.0.0.1", 0, 2, is_master=True, timeout=TIMEOUT)
    client = tcp_store("127.0.0.1", master.port, 2, is_master=False, timeout=TIMEOUT)
    client.set("k", "v")
    assert master.get("k") == b"v"
    opened = listening_addresses() - before
    assert opened == {("127.0.0.1", master.port)}
    del master, client


def test_a_published_port_is_held_until_the_store_takes_it():
    listener = listen("127.0.0.1")
    port = listener.getsockname()[1]
    with pytest.raises(OSError, match="in use"):
        listen("127.0.0.1", port)
    store = tcp_store("127.0.0.1", port, 1, is_master=True, timeout=TIMEOUT, listener=listener)
    assert store.port == port and listener.fileno() == -1  # the store took it over


GLOO_CHILD = """
import datetime, psutil, torch, torch.distributed as dist
from relax.distributed.store import pin_gloo_interface, tcp_store
pin_gloo_interface("127.0.0.1")
store = tcp_store("127.0.0.1", 0, 1, is_master=True, timeout=datetime.timedelta(seconds=10))
dist.init_process_group("gloo", store=store, rank=0, world_size=1)
t = torch.ones(3)
dist.all_reduce(t)
print(sorted({c.laddr.ip for c in psutil.Process().net_connections(kind="inet") if c.status == "LISTEN"}))
"""


def test_a_training_group_on_loopback_opens_nothing_beyond_it():
    """The fsdp worker's path: the gloo interface pinned to the group's address, the store bound
    there, init_process_group on that store (a child process: the default group is global)."""
    env = {k: v for k, v in os.environ.items() if k != "GLOO_SOCKET_IFNAME"}
    out = subprocess.run([sys.executable, "-c", GLOO_CHILD], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "['127.0.0.1']"


def test_interface_of_finds_the_loopback_interface_and_nothing_for_a_foreign_address():
    assert interface_of("127.0.0.1") in {n for n, addrs in psutil.net_if_addrs().items()
                                         if any(a.address == "127.0.0.1" for a in addrs)}
    assert interface_of("192.0.2.254") is None  # TEST-NET-1: on no interface of this machine
