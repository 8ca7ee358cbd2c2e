"""The rollout's tools, before Ray starts: the data system's polling mode, the rollout's HTTP (the
SlimeRouter, `--http-proxy`), per-category reward logging and engine profiling. Runs after the
backends are resolved (the profiling choices depend on the engine) and the run directory is known
(the default trace directory is named after the run).
"""

from __future__ import annotations

from relax.config.engine_profile import check_engine_profile_values, default_output_dir
from relax.config.errors import ConfigError
from relax.config.router import check_router_values
from relax.config.schema import RelaxConfig

BLOCKING_FETCH = ("--polling-mode false asks for TransferQueue's blocking fetch, which (transferqueue 0.1.11) holds "
                  "its controller's one request thread in a 5 s sleep while rows are missing, stalling every other "
                  "role's reads and writes, then fails with a TimeoutError; every consumer here polls for ready rows "
                  "with backoff instead: drop the flag (true is the default)")


def check_rollout_tools(cfg: RelaxConfig) -> RelaxConfig:
    """Each tool's flags; returns the config with the engine-trace directory resolved."""
    if not cfg.cluster.polling_mode:
        raise ConfigError(BLOCKING_FETCH)
    try:
        check_router_values(cfg.router)
        check_engine_profile_values(cfg.engine_profile, cfg.cluster.rollout_backend)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if cfg.router.use_slime_router and cfg.rollout.sglang_router_ip:
        raise ConfigError("--use-slime-router makes the built-in router forward every path through middlewares, and "
                          "--sglang-router-ip/--sglang-router-port send requests to a router already running instead: "
                          "keep one")
    if cfg.logging.log_reward_category and not cfg.reward.reward_key:
        raise ConfigError(f"--log-reward-category {cfg.logging.log_reward_category} reads a key of dict rewards, and a "
                          "dict reward needs --reward-key to name the entry that holds the score: set --reward-key")
    if not cfg.engine_profile.sglang_profile:
        return cfg
    log = cfg.logging
    return cfg.replace(sglang_profile_output_dir=default_output_dir(cfg.engine_profile, log.tb_experiment_name,
                                                                    cfg.misc.exp_dir))
