"""relax.config.nodes: a plan placed node by node (`--dry-run --cluster`), and what does not fit."""

from __future__ import annotations

import pytest

from relax.config import ConfigError, PlanError, parse_config
from relax.config.nodes import Node, format_nodes, parse_cluster, place_nodes, plan_on_nodes
from relax.config.plan import resolve_plan


def nodes(n: int, gpus: int = 0, cpus: float = 8.0) -> tuple[Node, ...]:
    return parse_cluster({"nodes": n, "gpus_per_node": gpus, "cpus_per_node": cpus})


@pytest.mark.parametrize("spec, says", [
    ({"gpus_per_node": 8}, "expected JSON"),
    ({"nodes": 2, "gpus": 8}, "expected JSON"),
    ({"nodes": 0}, "nodes must be an integer >= 1"),
    ({"nodes": 2, "gpus_per_node": -1}, "gpus_per_node must be an integer >= 0"),
    ({"nodes": 2, "cpus_per_node": 0}, "cpus_per_node must be a number > 0"),
])
def test_a_malformed_cluster_says_what_is_wrong(spec, says):
    with pytest.raises(ConfigError, match=says):
        parse_cluster(spec)


def test_cluster_needs_dry_run(base):
    with pytest.raises(ConfigError, match="--cluster plans for a cluster this machine is not part of and needs "
                                          "--dry-run"):
        parse_config(base + ["--cluster", '{"nodes": 2}'])
    assert parse_config(base + ["--cluster", '{"nodes": 2}', "--dry-run"]).cluster.cluster == {"nodes": 2}


def test_cpu_roles_go_where_most_cpus_are_left(base):
    cfg = parse_config(base + ["--resource", '{"actor": [1, 1], "rollout": [1, 2], "reference": [1, 1]}',
                               "--use-kl-loss"])
    plan = resolve_plan(cfg, 0)
    placed = place_nodes(plan, (Node(5, 0, "head"), Node(4, 0, "worker")))
    # head: TransferQueue 2 -> 3 left; the actor (1.1) goes to the worker (4 left), the rollout (0.3)
    # to the head (3 > 2.9), the reference to the worker (2.9 > 2.7); services stay on the head.
    assert placed.role_nodes == {"actor": (1,), "rollout": (0,), "reference": (1,), "dcs": (0,)}
    assert placed.cpus_used == (2.4, 2.2)
    assert any(line.startswith("  worker") and line.endswith("actor, reference") for line in format_nodes(placed))


def test_gpu_bundles_fill_the_nodes_in_order(base):
    cfg = parse_config(base + ["--fully-async", "--resource",
                               '{"actor": [1, 8], "rollout": [1, 8], "advantages": [1, 0]}',
                               "--use-rollout-logprobs"])
    plan = resolve_plan(cfg, 16)
    placed = plan_on_nodes(plan, nodes(2, gpus=8, cpus=32))
    assert placed.node_of("actor") == 0 and placed.node_of("rollout") == 1
    assert placed.gpus_used == (8, 8)


def test_a_role_that_would_span_nodes_is_named(base):
    cfg = parse_config(base + ["--resource", '{"actor": [1, 16], "rollout": [1, 16]}', "--rollout-batch-size", "16"])
    plan = resolve_plan(cfg, 16)
    with pytest.raises(PlanError, match="role actor would span nodes node 0, node 1 .*give it at most 8 GPUs"):
        place_nodes(plan, nodes(2, gpus=8, cpus=64))


def test_a_node_short_of_cpus_is_named(base):
    cfg = parse_config(base + ["--resource", '{"actor": [1, 8], "rollout": [1, 8]}'])
    plan = resolve_plan(cfg, 8)
    with pytest.raises(PlanError, match=r"node 0 needs 10.5 Ray CPUs \(actor, rollout, dcs \+ 2 for TransferQueue"):
        plan_on_nodes(plan, nodes(2, gpus=8, cpus=6))  # 12 CPUs in all, but node 0 holds every rank
