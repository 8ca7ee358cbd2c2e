"""The Rollout's fleet for external engines and a running router: the addresses become the fleet's
external engines (none launched), `--sglang-router-ip/--sglang-router-port` its router, which
plugins then see as `args.sglang_router_ip` / `args.sglang_router_port`."""

from __future__ import annotations

from relax.components.rollout import Rollout, plugin_args
from relax.config.plan import resolve_plan
from relax.config.schema import RelaxConfig


def external_cfg(**router) -> RelaxConfig:
    return RelaxConfig().replace(resource={"actor": [1, 1], "rollout": [1, 2]}, rollout_batch_size=1,
                                 rollout_backend="hf", rollout_external=True,
                                 rollout_external_engine_addrs=["10.0.0.5:30000", "[fd00::6]:30001"], **router)


def test_the_addresses_are_the_fleets_external_engines():
    cfg = external_cfg()
    spec = Rollout(cfg, resolve_plan(cfg, gpus=0).rollout)._fleet_spec()
    assert spec.external == ("http://10.0.0.5:30000", "http://[fd00::6]:30001") and spec.router is None


def test_a_running_router_is_the_fleets_router_and_the_plugins_router():
    for ip, url in (("10.0.0.9", "http://10.0.0.9:31000"), ("fd00::9", "http://[fd00::9]:31000")):
        cfg = external_cfg(sglang_router_ip=ip, sglang_router_port=31000)
        assert Rollout(cfg, resolve_plan(cfg, gpus=0).rollout)._fleet_spec().router == url
    args = plugin_args(external_cfg(sglang_router_ip="10.0.0.9", sglang_router_port=31000), "http://10.0.0.9:31000")
    assert (args.sglang_router_ip, args.sglang_router_port) == ("10.0.0.9", 31000)
