"""Which node of a cluster every role of a run sits on, and whether each node can hold its part.

A run plan (`relax.config.plan.RunPlan`) says what every role asks for (training ranks and
engines on GPU bundles, Ray CPUs for ranks and replicas); on a cluster of several nodes
`place_nodes` adds where, and checks each node:

- GPU runs: the run's placement group packs its bundles onto the nodes in order (Ray's PACK
  strategy: bundle b on the first node that still has a free GPU), so with G GPUs a node bundle
  b lands on node b // G. A role's replica goes on the node of its first bundle. A role's engines
  are child processes of its one replica and its training ranks meet on their replica's node, so
  every role must fit in one node: a role that would span nodes is an error naming it.
- CPU runs (no GPU): the driver, TransferQueue and the service roles (DCS, metrics) on node 0,
  the node the run starts from (the head under `ray job submit` and `spmd-multinode.sh`); every
  role with workers, in deploy order, on the node with the most Ray CPUs left (ties: the lower
  index), its ranks and engines with it.

Each node's Ray CPUs and GPUs are then checked against what is placed there. The same code
serves `relax-train --dry-run --cluster '{"nodes": N, "gpus_per_node": G, "cpus_per_node": C}'`
(a cluster this machine is not part of: check a recipe on a laptop before submitting it) and a
run that joins a real cluster of several nodes (relax.core.service pins each role's replica and
ranks to its node). No torch or ray import.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from relax.config.errors import ConfigError, PlanError
from relax.config.role_plans import REPLICA_CPUS, RolePlan

if TYPE_CHECKING:  # (plan imports the checks, which import this module)
    from relax.config.plan import RunPlan
    from relax.config.schema import RelaxConfig

CLUSTER_KEYS = ("nodes", "gpus_per_node", "cpus_per_node")
CLUSTER_FORM = '{"nodes": N, "gpus_per_node": G, "cpus_per_node": C}'


@dataclass(frozen=True)
class Node:
    """One node as the plan sees it: its Ray CPUs and GPUs, and a name to print (its address)."""

    cpus: float
    gpus: int
    name: str = ""


@dataclass(frozen=True)
class NodePlacement:
    """Per role, the nodes its processes run on (its replica's first); per node, what is used."""

    nodes: tuple[Node, ...]
    role_nodes: dict[str, tuple[int, ...]]
    cpus_used: tuple[float, ...]
    gpus_used: tuple[int, ...]

    def node_of(self, role: str) -> int:
        """The node of `role`'s replica (and of its ranks and engines on CPU)."""
        return self.role_nodes[role][0]

    def roles_on(self, node: int) -> list[str]:
        return [role for role, nodes in self.role_nodes.items() if node in nodes]


def parse_cluster(value: object) -> tuple[Node, ...]:
    """The nodes of `--cluster` (all alike); ConfigError naming what is wrong and the form."""
    if not isinstance(value, dict) or set(value) - set(CLUSTER_KEYS) or "nodes" not in value:
        raise ConfigError(f"--cluster {value!r}: expected JSON {CLUSTER_FORM} (gpus_per_node defaults to 0, "
                          "cpus_per_node to 8 per GPU or 8)")
    nodes, gpus = value["nodes"], value.get("gpus_per_node", 0)
    cpus = value.get("cpus_per_node", max(8, 8 * gpus) if isinstance(gpus, int) else 8)
    for key, number, low in (("nodes", nodes, 1), ("gpus_per_node", gpus, 0)):
        if not isinstance(number, int) or isinstance(number, bool) or number < low:
            raise ConfigError(f"--cluster: {key} must be an integer >= {low}, got {number!r}")
    if not isinstance(cpus, (int, float)) or isinstance(cpus, bool) or cpus <= 0:
        raise ConfigError(f"--cluster: cpus_per_node must be a number > 0 (Ray's logical CPUs), got {cpus!r}")
    return tuple(Node(float(cpus), gpus, f"node {i}") for i in range(nodes))


def check_cluster_flag(cfg: RelaxConfig) -> None:
    """--cluster describes a cluster to plan for: only with --dry-run (a run plans for the cluster it
    joins), and well formed."""
    spec = cfg.cluster.cluster
    if spec is None:
        return
    parse_cluster(spec)
    if not cfg.misc.dry_run:
        raise ConfigError("--cluster plans for a cluster this machine is not part of and needs --dry-run; a run "
                          "plans for the cluster it starts or joins (--ray-address, $RAY_ADDRESS)")


def place_nodes(plan: RunPlan, nodes: tuple[Node, ...]) -> NodePlacement:
    """Every role of `plan` on a node of `nodes` (see the module doc); PlanError when a role spans
    nodes or a node cannot hold what is placed on it."""
    if not nodes:
        raise PlanError("the cluster has no node")
    if plan.placement is not None and plan.placement.bundles:
        placement = _place_gpu_roles(plan, nodes)
    else:
        placement = _place_cpu_roles(plan, nodes)
    _check_fit(plan, placement)
    return placement


def bundle_nodes(nodes: tuple[Node, ...], bundles: int) -> list[int]:
    """The node of every GPU bundle when the placement group packs them onto `nodes` in order."""
    where = [i for i, node in enumerate(nodes) for _ in range(node.gpus)]
    if bundles > len(where):
        raise PlanError(f"the run needs {bundles} GPUs but the cluster has {len(where)}; lower the --resource "
                        "entries or add nodes")
    return where[:bundles]


def _place_gpu_roles(plan: RunPlan, nodes: tuple[Node, ...]) -> NodePlacement:
    placement = plan.placement
    on = bundle_nodes(nodes, placement.bundles)
    cpus, gpus = [0.0] * len(nodes), [0] * len(nodes)
    for bundle, node in enumerate(on):
        gpus[node] += 1
        cpus[node] += placement.bundle_cpus[bundle] if bundle < len(placement.bundle_cpus) else 0.0
    cpus[0] += plan.data_plane_cpus
    role_nodes: dict[str, tuple[int, ...]] = {}
    for role in plan.roles:
        used = sorted({on[b] for slot in role.slots for b in slot})
        if len(used) > 1:
            what = "engines are child processes of its one replica" if role.unit == "engine" else \
                "training ranks meet on their replica's node"
            raise PlanError(f"role {role.name} would span nodes {', '.join(nodes[n].name for n in used)} (its "
                            f"{_gpu_count(role)} GPUs from bundle {min(b for s in role.slots for b in s)}), but a "
                            f"role's {what}: give it at most {nodes[used[0]].gpus} GPUs or order the roles so "
                            "it starts on a node boundary (fully async places roles in deploy order)")
        node = used[0] if used else 0
        role_nodes[role.name] = (node,)
        cpus[node] += role.cpus - (role.workers if role.unit == "rank" else 0)  # ranks' CPUs are in their bundles
    return NodePlacement(nodes, role_nodes, tuple(round(c, 2) for c in cpus), tuple(gpus))


def _gpu_count(role: RolePlan) -> int:
    return len({b for slot in role.slots for b in slot})


def _place_cpu_roles(plan: RunPlan, nodes: tuple[Node, ...]) -> NodePlacement:
    cpus = [0.0] * len(nodes)
    cpus[0] = plan.data_plane_cpus
    role_nodes: dict[str, tuple[int, ...]] = {}
    for role in plan.roles:
        node = 0 if not role.workers else min(range(len(nodes)), key=lambda n: (cpus[n] - nodes[n].cpus, n))
        role_nodes[role.name] = (node,)
        cpus[node] += role.cpus
    return NodePlacement(nodes, role_nodes, tuple(round(c, 2) for c in cpus), (0,) * len(nodes))


def _check_fit(plan: RunPlan, placement: NodePlacement) -> None:
    for i, node in enumerate(placement.nodes):
        if placement.cpus_used[i] > node.cpus + 1e-9:
            here = ", ".join(placement.roles_on(i)) or "nothing but TransferQueue"
            data = f" + {plan.data_plane_cpus:g} for TransferQueue" if i == 0 else ""
            raise PlanError(f"{node.name} needs {placement.cpus_used[i]:g} Ray CPUs ({here}{data}; a training rank "
                            f"takes 1, a role replica {REPLICA_CPUS:g}) but has {node.cpus:g}: start its Ray with "
                            "more logical CPUs (`ray start --num-cpus N`, cpus_per_node in --cluster) or lower the "
                            "--resource entries")


def format_nodes(placement: NodePlacement) -> list[str]:
    """Lines for the plan's printout: per node what runs there and what it uses of what it has."""
    lines = ["", "nodes:"]
    for i, node in enumerate(placement.nodes):
        roles = ", ".join(placement.roles_on(i)) or "-"
        extra = " + driver, TransferQueue" if i == 0 else ""
        lines.append(f"  {node.name:<16}{placement.cpus_used[i]:>6g}/{node.cpus:<6g} CPUs "
                     f"{placement.gpus_used[i]:>3}/{node.gpus:<3} GPUs  {roles}{extra}")
    return lines


def plan_on_nodes(plan: RunPlan, nodes: tuple[Node, ...]) -> NodePlacement:
    """The whole-cluster fit check (`relax.config.plan.check_cluster`: CPUs and GPUs in all), then
    per node (`place_nodes`)."""
    from relax.config.plan import check_cluster

    check_cluster(plan, {"CPU": sum(n.cpus for n in nodes), "GPU": sum(n.gpus for n in nodes)})
    return place_nodes(plan, nodes)
