"""The run's shape: its mode, the debug modes, external engines, `--resource` and the batch sizes.

Exactly one mode runs (colocate unless `--fully-async`); a flag the chosen mode has no use for
fails with the way out. `--resource` names known roles with `[replicas, gpus]` (its default
and, with `--rollout-external`, its rollout entry are derived here), and the batch sizes divide
each other and the data-parallel workers (`--global-batch-size` is derived when unset).
"""

from __future__ import annotations

import logging

from relax.config.errors import ConfigError
from relax.config.roles import RESOURCE_ROLES, Role, in_order
from relax.config.schema import RelaxConfig

logger = logging.getLogger(__name__)


def check_mode(cfg: RelaxConfig) -> RelaxConfig:
    """Exactly one mode (colocate unless --fully-async); flags the chosen mode has no use for fail."""
    c = cfg.cluster
    if c.colocate and c.fully_async:
        raise ConfigError("--colocate and --fully-async are mutually exclusive; pick one (default: --colocate)")
    if c.max_staleness < 0:
        raise ConfigError(f"--max-staleness must be >= 0 (0 = on-policy), got {c.max_staleness}")
    if c.num_iters_per_train_update < 1:
        raise ConfigError(f"--num-iters-per-train-update must be >= 1, got {c.num_iters_per_train_update}")
    if c.fully_async:
        check_fully_async(cfg)
    elif c.max_staleness > 1:  # 0 and 1 both mean on-policy here, as the seeds' colocate scripts write them
        raise ConfigError(f"--max-staleness {c.max_staleness} bounds how far rollout runs ahead of training, "
                          "which only happens with --fully-async (colocate is always on-policy: 0 or 1); "
                          "add --fully-async or drop it")
    return cfg.replace(colocate=not c.fully_async)


def check_fully_async(cfg: RelaxConfig) -> None:
    """What the fully-async pipeline does not combine with (yet), each with its way out."""
    d, c = cfg.debug, cfg.cluster
    if d.debug_train_only or d.load_debug_rollout_data or d.debug_rollout_only:
        raise ConfigError("--fully-async runs rollout and training concurrently; the debug modes (--debug-train-only, "
                          "--load-debug-rollout-data, --debug-rollout-only) run in colocate mode: drop --fully-async")
    if cfg.rollout.rollout_data_postprocess_path:
        raise ConfigError("--rollout-data-postprocess-path runs on a whole step's rows before training, and fully "
                          "async training takes rows as they arrive: use it with --colocate")
    if cfg.rollout.update_weights_interval != 1:
        raise ConfigError("--update-weights-interval: in fully async mode --max-staleness bounds how far the engines' "
                          "weights lag; use it instead (--update-weights-interval is for --colocate)")
    if cfg.algo.use_rollout_entropy:
        raise ConfigError("--use-rollout-entropy computes entropies in the Actor's old-log-prob forward, which fully "
                          "async mode leaves to ActorFwd: use it with --colocate")
    offload = [flag for flag, on in (("--offload", c.offload), ("--offload-train", c.offload_train),
                                     ("--offload-rollout", c.offload_rollout)) if on]
    if offload:
        raise ConfigError(f"{' '.join(offload)}: in fully-async mode every role holds its own devices for the "
                          "whole run, so nothing is offloaded between phases; "
                          "drop the flag (offloading is for --colocate)")


def check_partial_rollout(cfg: RelaxConfig) -> None:
    r = cfg.rollout
    if not r.partial_rollout:
        for flag, value in (("--partial-rollout-max-aborted-count", r.partial_rollout_max_aborted_count is not None),
                            ("--mask-offpolicy-in-partial-rollout", r.mask_offpolicy_in_partial_rollout)):
            if value:
                raise ConfigError(f"{flag} only applies with --partial-rollout; add --partial-rollout or drop {flag}")
        return
    if not cfg.cluster.fully_async:
        raise ConfigError("--partial-rollout resumes requests that a weight update aborts mid-generation, which only "
                          "happens with --fully-async (in colocate mode no request is in flight at an update); "
                          "add --fully-async or drop --partial-rollout")
    if r.partial_rollout_max_aborted_count is not None and r.partial_rollout_max_aborted_count < 0:
        raise ConfigError(f"--partial-rollout-max-aborted-count must be >= 0 (or unset: no cap), "
                          f"got {r.partial_rollout_max_aborted_count}")
    if cfg.cluster.max_staleness == 0:
        logger.warning("--partial-rollout with --max-staleness 0: no weight push lands while a step generates, so "
                       "nothing is ever aborted; raise --max-staleness for rollout to overlap training")


def check_debug(cfg: RelaxConfig) -> RelaxConfig:
    if cfg.debug.load_debug_rollout_data:  # replaying saved rollouts means training only
        cfg = cfg.replace(debug_train_only=True)
    d = cfg.debug
    if d.debug_train_only and d.debug_rollout_only:
        raise ConfigError("--debug-train-only and --debug-rollout-only exclude each other; pick one")
    if d.debug_train_only and not d.load_debug_rollout_data:
        raise ConfigError("--debug-train-only trains on saved rollouts: add --load-debug-rollout-data PATH "
                          "(written by an earlier run's --save-debug-rollout-data PATH)")
    for flag, path in (("--load-debug-rollout-data", d.load_debug_rollout_data),
                       ("--save-debug-rollout-data", d.save_debug_rollout_data),
                       ("--save-debug-train-data", d.save_debug_train_data)):
        if path and "{rollout_id}" not in path:
            raise ConfigError(f"{flag} {path}: the path needs a {{rollout_id}} placeholder (one file per step)")
    if d.debug_train_only and (cfg.eval.eval_interval or cfg.rollout.num_rollout is None):
        raise ConfigError("--debug-train-only runs no engines: drop --eval-interval and set --num-rollout")
    return cfg


def host_port(address: str) -> tuple[str, int] | None:
    """"10.0.0.5:30000" / "[::1]:30000" -> (host, port); None when not a well-formed host:port."""
    host, sep, port = address.strip().rpartition(":")
    bracketed = host.startswith("[") and host.endswith("]")
    host = host[1:-1] if bracketed else host
    if not sep or not host or "/" in host or (":" in host and not bracketed) or not port.isdigit():
        return None
    return (host, int(port)) if 0 < int(port) < 65536 else None


def check_external(cfg: RelaxConfig) -> RelaxConfig:
    """--rollout-external with its addresses (the addresses are the engines: `--resource rollout`
    defaults to their count, and a different count fails), and a router given by ip and port."""
    r, c = cfg.rollout, cfg.cluster
    addrs = r.rollout_external_engine_addrs or []
    if r.sglang_router_ip is not None or r.sglang_router_port is not None:
        if r.sglang_router_ip is None or r.sglang_router_port is None:
            raise ConfigError("--sglang-router-ip and --sglang-router-port name a running router together; give both "
                              "(or neither: Relax then starts its own router)")
        if host_port(f"{r.sglang_router_ip}:{r.sglang_router_port}") is None:
            raise ConfigError(f"--sglang-router-ip {r.sglang_router_ip} --sglang-router-port {r.sglang_router_port}: "
                              "expected a host (no scheme, no port) and a port in 1..65535, e.g. "
                              "--sglang-router-ip 10.0.0.5 --sglang-router-port 30000")
    if not r.rollout_external:
        if addrs:
            raise ConfigError("--rollout-external-engine-addrs lists engines Relax would not use: add "
                              "--rollout-external (use these running engines instead of launching any) or drop them")
        return cfg
    if not addrs:
        raise ConfigError("--rollout-external needs --rollout-external-engine-addrs host:port [host:port ...] (the "
                          "running engines, one address each)")
    bad = [a for a in addrs if host_port(str(a)) is None]
    if bad:
        raise ConfigError(f"--rollout-external-engine-addrs {bad[0]!r} is not host:port (no scheme), e.g. "
                          "10.0.0.5:30000 or [fd00::5]:30000")
    if len(set(addrs)) != len(addrs):
        raise ConfigError(f"--rollout-external-engine-addrs lists an engine twice: {addrs}")
    if c.true_on_policy_mode:
        raise ConfigError("--true-on-policy-mode launches the engines in float32 with the trainer's numerics "
                          "(--rl-on-policy-target fsdp); external engines run with the options they were started "
                          "with, so the log-probs cannot be matched: drop --rollout-external or --true-on-policy-mode")
    if c.offload_rollout:
        raise ConfigError("--offload-rollout: external engines do not share the trainer's GPUs and Relax does not "
                          "release their memory; drop --offload-rollout (or --rollout-external)")
    if c.resource is not None and not isinstance(c.resource, dict):
        return cfg  # check_resource says what --resource must look like
    res = dict(c.resource or {"actor": [1, 1]})  # --resource JSON: its keys stay strings
    given = res.setdefault("rollout", [1, len(addrs)])
    if not isinstance(given, list) or len(given) != 2 or given[1] != len(addrs):
        raise ConfigError(f"--resource rollout {given} disagrees with the {len(addrs)} address(es) of "
                          "--rollout-external-engine-addrs: with --rollout-external the addresses are the engines "
                          f"(Relax launches none and reserves no GPUs for them); set \"rollout\": [1, {len(addrs)}] "
                          "or drop the rollout entry")
    return cfg.replace(resource=res)


def check_resource(cfg: RelaxConfig) -> RelaxConfig:
    """`--resource` (default: one actor rank, one engine) names known roles with `[replicas, gpus]`
    and gives the actor and the rollout at least one each. Its keys stay the JSON strings."""
    res = cfg.cluster.resource
    if res is None:
        cfg = cfg.replace(resource={"actor": [1, 1], "rollout": [1, 1]})
        res = cfg.cluster.resource
    if not isinstance(res, dict):
        example = '{"actor": [1, 2], "rollout": [1, 2]}'
        raise ConfigError(f"--resource must be a JSON object like '{example}', got {res!r}")
    for role, spec in res.items():
        if role not in RESOURCE_ROLES:
            raise ConfigError(f"--resource: unknown role {role!r}; known roles: {', '.join(in_order(RESOURCE_ROLES))}")
        if not (isinstance(spec, list) and len(spec) == 2 and all(isinstance(x, int) and x >= 0 for x in spec)):
            raise ConfigError(f"--resource {role}: expected [replicas, gpus] as two non-negative integers, "
                              f"got {spec!r}")
    for role in (Role.ACTOR, Role.ROLLOUT):
        if role not in res or res[role][1] < 1:
            raise ConfigError(f"--resource needs \"{role}\": [1, N] with N >= 1 (workers/engines on CPU, GPUs on GPU)")
    return cfg


def check_batches(cfg: RelaxConfig) -> RelaxConfig:
    r, b = cfg.rollout, cfg.batch
    if not r.rollout_batch_size or r.rollout_batch_size < 1:
        raise ConfigError("--rollout-batch-size is required (prompts per rollout step), e.g. --rollout-batch-size 32")
    if r.n_samples_per_prompt < 1:
        raise ConfigError(f"--n-samples-per-prompt must be >= 1, got {r.n_samples_per_prompt}")
    total = r.rollout_batch_size * r.n_samples_per_prompt
    if b.num_steps_per_rollout is not None:
        if b.num_steps_per_rollout < 1 or total % b.num_steps_per_rollout:
            raise ConfigError(f"--num-steps-per-rollout {b.num_steps_per_rollout} must divide rollout_batch_size * "
                              f"n_samples_per_prompt = {total}")
        cfg = cfg.replace(global_batch_size=total // b.num_steps_per_rollout)
    if cfg.batch.global_batch_size is None:
        cfg = cfg.replace(global_batch_size=total)
    b = cfg.batch
    if b.global_batch_size < 1 or total % b.global_batch_size:
        raise ConfigError(f"--global-batch-size {b.global_batch_size} must divide rollout_batch_size * "
                          f"n_samples_per_prompt = {r.rollout_batch_size} * {r.n_samples_per_prompt} = {total}")
    for role in (Role.ACTOR, Role.CRITIC):
        n_workers = (cfg.cluster.resource.get(role) or [1, 1])[1] or 1
        if b.global_batch_size % n_workers:
            raise ConfigError(f"--global-batch-size {b.global_batch_size} must be divisible by the {role}'s "
                              f"{n_workers} data-parallel workers (--resource {role})")
    if b.use_dynamic_batch_size and not b.max_tokens_per_gpu:
        raise ConfigError("--use-dynamic-batch-size needs --max-tokens-per-gpu (token budget per micro-batch)")
    if b.micro_batch_size < 1:
        raise ConfigError(f"--micro-batch-size must be >= 1, got {b.micro_batch_size}")
    if r.num_rollout is None and r.num_epoch is None:
        raise ConfigError("set --num-rollout (rollout steps) or --num-epoch (passes over --prompt-data)")
    if r.over_sampling_batch_size is not None and r.over_sampling_batch_size < r.rollout_batch_size:
        raise ConfigError(f"--over-sampling-batch-size {r.over_sampling_batch_size} must be >= --rollout-batch-size "
                          f"{r.rollout_batch_size}")
    return cfg
