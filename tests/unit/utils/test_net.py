"""relax.utils.net: the ports test and training groups pick."""

from __future__ import annotations


def test_ports_for_later_groups_are_distinct_free_and_outside_the_ephemeral_range():
    """free_ports: ports a test's groups bind minutes later come from below the range the OS picks
    ports from itself, so no outgoing connection or bind(0) takes one meanwhile."""
    import socket

    from relax.utils.net import ephemeral_range, free_ports

    ports = free_ports(12)
    assert len(set(ports)) == 12 and all(20000 <= p < ephemeral_range()[0] for p in ports)
    for port in ports:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))
