"""Cross-flag checks and derived defaults, run before Ray starts.

`check_config(cfg)` runs every check of `CHECKS` in order and returns the final config. Each
check raises `ConfigError` naming the flags involved and the fix. The config is frozen: a check
that derives a value (the mode, the default --resource, the global batch size, the resolved
backends, the run directory) returns a new config, so derived values are filled in here once
and no other module re-derives them. The checks live by what they judge:

- `flags`: unknown flags (with did-you-mean), flags declared not built (an error) or without effect
  here (a note);
- `ranges`: numeric flags in their ranges;
- `modes`: the mode, debug modes, external engines, `--resource`, batch sizes;
- `algorithm`: KL reference, critic, OPD teacher, GenRM judge;
- `ckpt_steps`: --ref-ckpt-step / --opd-teacher-ckpt-step name a complete step of their checkpoint directory;
- `inputs`: the model, data and eval files, context limits, prefetching, multimodal keys;
- `backends` (+ `megatron`): backend resolution and each backend's flags, true-on-policy mode;
- `relax.config.nodes.check_cluster_flag`: `--cluster` (a cluster to plan for, with --dry-run);
- `lora`: the LoRA flags and what a LoRA run cannot be combined with;
- `routing`: routing replay (MoE) fits the model and the run; R3 implies --use-routing-replay;
- `plugins`, `agentic` (the environment module, multi-turn flags), `outputs` (run directory,
  notifications, metrics sinks), `fault`, `elastic` (scaling flags, the autoscaler YAML);
- `optimizer`: optimizer placement (host offload, bfloat16 moments) and the overlap flags;
- `rollout_tools`: polling mode, the SlimeRouter and --http-proxy, reward categories, engine profiling.
- `profiling`: the training ranks' torch profiler and memory tools (after the run directory is known).
- `train_memory`: --keep-old-actor, --disable-weights-backuper, the training memory margin,
  --check-weight-update-equal.
"""

from __future__ import annotations

from typing import Callable

from relax.config.checks.agentic import check_agentic
from relax.config.checks.algorithm import check_algorithm, check_genrm
from relax.config.checks.backends import EngineCheck, check_backends, check_true_on_policy
from relax.config.checks.ckpt_steps import check_ckpt_steps
from relax.config.checks.elastic import check_elastic
from relax.config.checks.lora import check_lora
from relax.config.checks.fault import check_fault_flags
from relax.config.checks.flags import check_unknown_flags, check_unsupported
from relax.config.checks.inputs import (
    check_context, check_eval, check_multimodal, check_paths, check_prefetch, default_response_len,
)
from relax.config.checks.optimizer import check_optimizer
from relax.config.checks.modes import (
    check_batches, check_debug, check_external, check_mode, check_partial_rollout, check_resource,
)
from relax.config.checks.outputs import check_exp_dir, check_metrics_sinks, check_notify
from relax.config.checks.plugins import check_plugins
from relax.config.checks.profiling import check_train_profile
from relax.config.checks.ranges import check_ranges
from relax.config.checks.rollout_tools import check_rollout_tools
from relax.config.checks.routing import check_routing_replay
from relax.config.checks.train_memory import check_train_memory
from relax.config.layouts import check_ref_actor_config
from relax.config.nodes import check_cluster_flag
from relax.config.schema import RelaxConfig

Check = Callable[[RelaxConfig], "RelaxConfig | None"]


# In order: a check may rely on what the ones before derived (the mode, the resource, the batch).
CHECKS: tuple[Check, ...] = (
    check_unknown_flags, check_unsupported, check_ranges, check_mode, check_partial_rollout, check_debug,
    check_external, check_resource, check_batches, check_algorithm, check_paths, default_response_len, check_agentic,
    check_eval, check_context, check_prefetch, check_genrm, check_ref_actor_config, check_multimodal,
    check_true_on_policy, check_cluster_flag, check_backends, check_lora, check_ckpt_steps, check_routing_replay,
    check_plugins, check_exp_dir, check_notify, check_metrics_sinks, check_fault_flags, check_elastic,
    check_rollout_tools, check_optimizer, check_train_profile, check_train_memory,
)


def check_config(cfg: RelaxConfig, engine_check: EngineCheck | None = None) -> RelaxConfig:
    """Every check, in order; returns the config with its derived values (a new, frozen config).
    `engine_check`: the inference backends' option check, handed to `check_backends` (config
    imports no backend; `relax.backends.registry.check_engine_options` is the one a run uses)."""
    for check in CHECKS:
        derived = check_backends(cfg, engine_check) if check is check_backends else check(cfg)
        cfg = derived or cfg
    return cfg


__all__ = ["CHECKS", "Check", "EngineCheck", "check_config"]
