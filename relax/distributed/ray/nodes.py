"""The nodes of the Ray cluster a run joined: which role runs on which node, and which node left.

On a cluster of several nodes the run places its roles with `relax.config.nodes.place_nodes`
(node 0 is the driver's node, the others follow by address) and pins each role there: its Serve
replica and its training ranks ask for a sliver of the node's own resource `node:<address>`,
which every Ray node has, so Ray starts them on that node and nowhere else (engines are child
processes of their replica and follow it). The placement is written to `<exp-dir>/placement.json`
for the operator (and the two-node test, which checks it against the processes).

A node that leaves mid-run (its machine died, its raylet was killed, a preemption) fails the
attempt with `NodeLost`, which names the node and the roles it held; with `--use-health-check`
the next attempt plans again for the nodes that are left (relax.core.health.run_with_restarts).
Nodes are told apart by address: two nodes on one address (several raylets on one host) are
not pinned.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from typing import Any

from relax.config.nodes import Node, NodePlacement

logger = logging.getLogger(__name__)

NODE_ENV = "RELAX_NODE_IP"  # in a role's replica: the address of the node its ranks are pinned to
PIN = 0.001  # of a node's `node:<address>` resource (1.0 in all): enough to pin, never scarce
PLACEMENT_FILE = "placement.json"


@dataclass(frozen=True)
class RayNode:
    node_id: str
    ip: str
    cpus: float
    gpus: int


class NodeLost(RuntimeError):
    """A node of the run left the Ray cluster while the run used it."""


def alive_nodes() -> list[RayNode]:
    """The cluster's live nodes: the driver's first, then by address."""
    import ray

    here = ray.get_runtime_context().get_node_id()
    nodes = [RayNode(n["NodeID"], n["NodeManagerAddress"], float(n["Resources"].get("CPU", 0.0)),
                     int(n["Resources"].get("GPU", 0))) for n in ray.nodes() if n.get("Alive")]
    return sorted(nodes, key=lambda n: (n.node_id != here, n.ip, n.node_id))


def as_plan_nodes(nodes: list[RayNode]) -> tuple[Node, ...]:
    return tuple(Node(n.cpus, n.gpus, f"node {n.ip}") for n in nodes)


def pinnable(nodes: list[RayNode]) -> bool:
    """Several nodes, each on its own address (else `node:<address>` does not tell them apart)."""
    return len(nodes) > 1 and len({n.ip for n in nodes}) == len(nodes)


def pin_options(ip: str) -> dict[str, Any]:
    """Ray actor options that start an actor on the node at `ip` only."""
    return {"resources": {f"node:{ip}": PIN}}


def same_node_options() -> dict[str, Any] | None:
    """In a role's replica: the options that pin its ranks to the role's node (None: not pinned)."""
    ip = os.environ.get(NODE_ENV)
    return pin_options(ip) if ip else None


def lost_nodes(nodes: list[RayNode]) -> list[RayNode]:
    """Those of `nodes` that are no longer alive in the cluster."""
    import ray

    alive = {n["NodeID"] for n in ray.nodes() if n.get("Alive")}
    return [n for n in nodes if n.node_id not in alive]


def node_lost(lost: list[RayNode], held: dict[str, str], error: BaseException) -> NodeLost:
    """The error that names the nodes that left and what ran there."""
    parts = []
    for node in lost:
        roles = sorted(role for role, ip in held.items() if ip == node.ip)
        parts.append(f"node {node.ip} (node id {node.node_id[:12]}, {node.cpus:g} CPUs, {node.gpus} GPUs) left the "
                     f"Ray cluster during the run; it held {', '.join(roles) or 'no role of the run'}")
    first = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return NodeLost("; ".join(parts) + f" (the run then failed with {type(error).__name__}: {first[:300]}). "
                    "--use-health-check restarts the run from its last checkpoint on the nodes left")


def write_placement(exp_dir: str, nodes: list[RayNode], placed: NodePlacement | None) -> dict[str, str]:
    """`<exp-dir>/placement.json`: the nodes and, per role, the address of its node. Returns the latter."""
    roles = {role: nodes[placed.node_of(role)].ip for role in placed.role_nodes} if placed else {}
    body = {"nodes": [{"ip": n.ip, "node_id": n.node_id, "cpus": n.cpus, "gpus": n.gpus} for n in nodes],
            "roles": roles, "pinned": placed is not None}
    os.makedirs(exp_dir, exist_ok=True)
    with open(os.path.join(exp_dir, PLACEMENT_FILE), "w", encoding="utf-8") as f:
        json.dump(body, f, indent=2)
    return roles
