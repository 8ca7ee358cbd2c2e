"""Network helpers shared by every layer (engines, weight-sync groups, training groups)."""

from __future__ import annotations

import random
import socket

# Idle pooled connections are dropped by the client before the engine would drop them (it keeps
# them ENGINE_KEEP_ALIVE_S), so a request never goes out on a connection the server is closing.
# (Here, not in http_utils: the engine server needs the constant, not the client and its aiohttp.)
CLIENT_KEEP_ALIVE_S = 15.0
ENGINE_KEEP_ALIVE_S = 120


def free_port(host: str = "127.0.0.1") -> int:
    """A port the OS says is free on `host` now (IPv6 when the host has a colon). Another process may
    take it before the caller binds it; a server this process launches takes `bound_socket` instead."""
    with bound_socket(host) as sock:
        return sock.getsockname()[1]


def bound_socket(host: str = "127.0.0.1") -> socket.socket:
    """A TCP socket bound to a port the OS picks on `host`, not yet listening: handed open to a
    server process (`pass_fds`), the port is the server's from the moment it is chosen."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    try:
        sock.bind((host, 0))
    except OSError:
        sock.close()
        raise
    return sock


def ephemeral_range() -> tuple[int, int]:
    """The OS's range for ports it picks itself (outgoing connections, `bind(0)`); Linux's default."""
    try:
        low, high = open("/proc/sys/net/ipv4/ip_local_port_range").read().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """`n` distinct ports free on `host` now, for groups that bind them later (one after the other,
    minutes apart): below the OS's ephemeral range, from 20000 (above Ray's worker ports), where the
    OS never hands a port to another process's outgoing connection or `bind(0)` meanwhile (ports
    taken from that range were: EADDRINUSE in the megatron test groups). Falls back to ports the
    OS picks when that range is too narrow."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    low, high = 20000, ephemeral_range()[0]
    candidates = list(range(low, high))
    random.SystemRandom().shuffle(candidates)
    chosen: list[int] = []
    for port in candidates:
        if len(chosen) == n:
            return chosen
        with socket.socket(family) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
        chosen.append(port)
    if len(chosen) == n:
        return chosen
    sockets = [socket.socket(family) for _ in range(n)]  # (the OS's own picks, all bound at once: distinct)
    try:
        for sock in sockets:
            sock.bind((host, 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()
