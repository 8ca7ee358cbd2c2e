"""Rendezvous stores and collective sockets that listen on one address only.

torch's `TCPStore` server and gloo's pairs listen on every interface by default, which would
open the training and weight-sync groups to the network. A run binds them to its bind address
instead: loopback on one node, the node's cluster address (Ray's node IP) across nodes
(docs/launch.md, "What listens where"). `tcp_store` hands TCPStore a socket already bound there;
`pin_gloo_interface` makes gloo use the interface that carries that address. torch is imported where a
store is made: every Serve replica asks `bind_host` (relax.distributed.ray.local.bind_serve_grpc), and a
replica that holds no tensors (the DCS coordinator, the metrics service) need not load torch for it.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import socket
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch.distributed as dist

BIND_ENV = "RELAX_BIND_HOST"


def bind_host() -> str:
    """The address this process's servers listen on: `$RELAX_BIND_HOST`, else this Ray node's
    address (127.0.0.1 for a run's private local Ray), else loopback."""
    if os.environ.get(BIND_ENV):
        return os.environ[BIND_ENV]
    try:
        import ray

        if ray.is_initialized():
            return ray.util.get_node_ip_address().strip("[]")
    except ImportError:
        pass
    return "127.0.0.1"


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(socket.gethostbyname(host)).is_loopback
    except (OSError, ValueError):
        return False


def address_towards(peer: str) -> str:
    """This process's address for a group with a member at `peer`: loopback for a loopback peer, else
    the run's bind address, else (a run on one node reaching another host, e.g. an external engine) the
    address of the interface the kernel routes to `peer` through (nothing is sent)."""
    if is_loopback(peer):
        return "127.0.0.1"
    host = bind_host()
    if not is_loopback(host):
        return host
    family, kind, _, _, address = socket.getaddrinfo(peer, 1, type=socket.SOCK_DGRAM)[0]
    with socket.socket(family, kind) as sock:
        sock.connect(address)
        return sock.getsockname()[0]


def listen(host: str, port: int = 0) -> socket.socket:
    """A TCP socket bound to `host:port` (0: any free port) and listening."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(1024)
    except OSError:
        sock.close()
        raise
    return sock


def tcp_store(host: str, port: int, world_size: int, *, is_master: bool, timeout: datetime.timedelta,
              listener: socket.socket | None = None) -> dist.TCPStore:
    """A TCPStore whose server (on the master) listens on `host` only. `listener`: a socket from
    `listen(host, port)` the caller already holds (it had to publish the port first); the store
    takes it over (the caller's socket object is closed)."""
    import torch.distributed as dist

    if not is_master:
        return dist.TCPStore(host, port, world_size, False, timeout=timeout, wait_for_workers=False)
    listener = listener or listen(host, port)
    try:
        # The store owns (and eventually closes) a duplicate; ours is closed right away.
        return dist.TCPStore(host, listener.getsockname()[1], world_size, True, timeout=timeout,
                             wait_for_workers=False, master_listen_fd=os.dup(listener.fileno()))
    finally:
        listener.close()


def interface_of(host: str) -> str | None:
    """The network interface that carries `host`'s address (None when no local one does)."""
    import psutil

    try:
        address = socket.gethostbyname(host)
    except OSError:
        return None
    for name, addrs in psutil.net_if_addrs().items():
        if any(a.address.split("%")[0] == address for a in addrs):
            return name
    return None


def pin_gloo_interface(host: str) -> None:
    """Make gloo listen on the interface carrying `host` (not the one the hostname resolves to),
    unless the user chose one with `GLOO_SOCKET_IFNAME`."""
    name = interface_of(host)
    if name and not os.environ.get("GLOO_SOCKET_IFNAME"):
        os.environ["GLOO_SOCKET_IFNAME"] = name
