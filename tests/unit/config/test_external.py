"""External engines and routers in the config and the plan: `--rollout-external` with its addresses,
`--sglang-router-ip/--sglang-router-port` as Relax flags, what fails and why, and a plan that
launches no engine and reserves no GPU for an external fleet."""

from __future__ import annotations


import pytest

from relax.config import ConfigError, parse_config
from relax.config.plan import format_plan, resolve_plan

EXTERNAL = ["--rollout-external", "--rollout-external-engine-addrs", "10.0.0.5:30000", "[fd00::6]:30001"]


def test_router_flags_are_relax_flags_not_sglang_server_options(base):
    cfg = parse_config(base + ["--sglang-router-ip", "10.0.0.9", "--sglang-router-port", "30000",
                               "--sglang-mem-fraction-static", "0.7"])
    assert (cfg.rollout.sglang_router_ip, cfg.rollout.sglang_router_port) == ("10.0.0.9", 30000)
    assert cfg.sglang == {"mem_fraction_static": "0.7"}
    assert (cfg.args.sglang_router_ip, cfg.args.sglang_router_port) == ("10.0.0.9", 30000)


@pytest.mark.parametrize("extra, needle", [
    (["--sglang-router-ip", "10.0.0.9"], "give both"),
    (["--sglang-router-port", "30000"], "give both"),
    (["--sglang-router-ip", "http://10.0.0.9", "--sglang-router-port", "30000"], "no scheme, no port"),
    (["--sglang-router-ip", "10.0.0.9", "--sglang-router-port", "0"], "a port in 1..65535"),
    (["--rollout-external"], "--rollout-external needs --rollout-external-engine-addrs"),
    (["--rollout-external-engine-addrs", "10.0.0.5:30000"], "add --rollout-external"),
    (["--rollout-external", "--rollout-external-engine-addrs", "10.0.0.5:30000", "10.0.0.6"],
     "'10.0.0.6' is not host:port"),
    (["--rollout-external", "--rollout-external-engine-addrs", "http://10.0.0.5:30000"],
     "'http://10.0.0.5:30000' is not host:port"),
    (["--rollout-external", "--rollout-external-engine-addrs", "10.0.0.5:99999"], "'10.0.0.5:99999' is not"),
    (["--rollout-external", "--rollout-external-engine-addrs", "h:1", "h:1"], "lists an engine twice"),
    (EXTERNAL + ["--resource", '{"actor": [1, 1], "rollout": [1, 4]}'],
     r"--resource rollout \[1, 4\] disagrees with the 2 address\(es\)"),
    (EXTERNAL + ["--true-on-policy-mode"], "external engines run with the options they were started with"),
    (EXTERNAL + ["--offload-rollout"], "Relax does not release their memory"),
])
def test_bad_external_or_router_flags_fail_naming_the_flag(base, extra, needle):
    with pytest.raises(ConfigError, match=needle):
        parse_config(base + extra)


def test_the_addresses_are_the_rollout_engines(base):
    assert parse_config(base + EXTERNAL).cluster.resource == {"actor": [1, 1], "rollout": [1, 2]}
    given = parse_config(base + EXTERNAL + ["--resource", '{"actor": [1, 2], "rollout": [1, 2]}'])
    assert given.cluster.resource == {"actor": [1, 2], "rollout": [1, 2]}
    no_rollout = parse_config(base + EXTERNAL + ["--resource", '{"actor": [1, 2]}'])
    assert no_rollout.cluster.resource["rollout"] == [1, 2]


def test_an_external_fleet_launches_nothing_and_reserves_no_gpu(base):
    cfg = parse_config(base + EXTERNAL + ["--rollout-num-gpus-per-engine", "4"])
    plan = resolve_plan(cfg, gpus=1)
    rollout = plan.role("rollout")
    assert (rollout.workers, rollout.unit, rollout.slots, rollout.gpus) == (2, "external engine", (), 0)
    assert plan.gpus == 1 and not plan.rollout.release_memory  # the actor's GPU only; nothing to release
    assert "rollout" in plan.weight_receivers
    assert "rollout    2 external engines" in format_plan(plan, cfg)
    assert resolve_plan(parse_config(base), gpus=1).role("rollout").unit == "engine"
