"""Each training role's parallel layout, and `--ref-actor-config`, the Reference's and ActorFwd's own.

The Reference and ActorFwd only score rows, so launch scripts give them a lighter layout than
the Actor's: `--ref-actor-config '{"tensor_model_parallel_size": 1, "sequence_parallel": false,
"max_tokens_per_gpu": 16384, "only_load_weight": true}'` (the seeds' keys; `threads` sets their
torch threads on CPU). `scorer_config(cfg)` is the config those two services build their ranks
from. `check_role_layouts` is a plan check: under the megatron backend a role's ranks must split
into its tensor x pipeline x context groups (and expert groups), otherwise the run fails before
Ray starts instead of in the worker minutes later.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from relax.config.errors import ConfigError, PlanError
from relax.config.roles import TRAINING_ROLES, Role
from relax.config.schema import RelaxConfig

# --ref-actor-config key -> (kind, what it sets)
REF_ACTOR_KEYS: dict[str, tuple[type, str]] = {
    "threads": (int, "torch threads of each rank on CPU"),
    "tensor_model_parallel_size": (int, "their --tensor-model-parallel-size (megatron)"),
    "pipeline_model_parallel_size": (int, "their --pipeline-model-parallel-size (megatron)"),
    "context_parallel_size": (int, "their --context-parallel-size (megatron)"),
    "sequence_parallel": (bool, "their --sequence-parallel (megatron)"),
    "max_tokens_per_gpu": (int, "their token budget per scoring micro-batch (dynamic batching)"),
    "only_load_weight": (bool, "they load the weights only (always so: they are frozen scorers)"),
}
SCORERS = (Role.REFERENCE, Role.ACTOR_FWD)
MEGATRON_KEYS = ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
                 "sequence_parallel")


def check_ref_actor_config(cfg: RelaxConfig) -> None:
    """--ref-actor-config: a JSON object of the keys above, each of its kind (others would be unused)."""
    overrides = cfg.cluster.ref_actor_config or {}
    example = '\'{"tensor_model_parallel_size": 1, "max_tokens_per_gpu": 16384}\''
    if not isinstance(overrides, dict):
        raise ConfigError(f"--ref-actor-config must be a JSON object like {example}, got {overrides!r}")
    unknown = sorted(set(overrides) - set(REF_ACTOR_KEYS))
    if unknown:
        raise ConfigError(f"--ref-actor-config: unknown key(s) {unknown}; it takes {', '.join(REF_ACTOR_KEYS)}")
    for key, value in overrides.items():
        kind = REF_ACTOR_KEYS[key][0]
        bad = not isinstance(value, bool) if kind is bool else (
            not isinstance(value, int) or isinstance(value, bool) or value < 1)
        if bad:
            want = "true or false" if kind is bool else "an integer >= 1"
            raise ConfigError(f"--ref-actor-config {key} must be {want}, got {value!r}")


def scorer_config(cfg: RelaxConfig) -> RelaxConfig:
    """The config the Reference and ActorFwd build their ranks from: the run's, with
    --ref-actor-config's layout and token budget (a budget turns dynamic batching on for them)."""
    o = cfg.cluster.ref_actor_config or {}
    changes: dict[str, Any] = {k: o[k] for k in MEGATRON_KEYS if k in o}
    if "max_tokens_per_gpu" in o:
        changes |= {"use_dynamic_batch_size": True, "max_tokens_per_gpu": o["max_tokens_per_gpu"],
                    "log_probs_max_tokens_per_gpu": o["max_tokens_per_gpu"]}
    return cfg.replace(**changes) if changes else cfg


def ref_actor_notes(cfg: RelaxConfig) -> list[str]:
    """Plan notes for --ref-actor-config keys that do nothing in this run, and why."""
    o, notes = cfg.cluster.ref_actor_config or {}, []
    megatron = [k for k in MEGATRON_KEYS if k in o]
    if megatron and cfg.cluster.train_backend != "megatron":
        notes.append(f"--ref-actor-config {', '.join(megatron)}: the {cfg.cluster.train_backend} backend has no "
                     "model-parallel layout; ignored")
    if o.get("only_load_weight") is not None:
        notes.append("--ref-actor-config only_load_weight: the Reference and ActorFwd are frozen scorers and always "
                     "load the weights only (no optimizer state); nothing to change")
    return notes


@dataclass(frozen=True)
class Layout:
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    etp: int = 1

    @property
    def model_parallel(self) -> int:
        return self.tp * self.pp * self.cp


def role_layout(cfg: RelaxConfig, role: Role) -> Layout:
    p = (scorer_config(cfg) if role in SCORERS else cfg).parallel
    return Layout(p.tensor_model_parallel_size, p.pipeline_model_parallel_size, p.context_parallel_size,
                  p.expert_model_parallel_size, p.expert_tensor_parallel_size)


def check_role_layouts(cfg: RelaxConfig, roles: Iterable[tuple[Role, int, str]]) -> None:
    """Megatron: each training role's ranks (`(role, workers, unit)`) split into its layout."""
    if cfg.cluster.train_backend != "megatron":
        return
    for name, workers, unit in roles:
        if name not in TRAINING_ROLES or unit != "rank" or not workers:
            continue
        lay = role_layout(cfg, name)
        fix = (f"give it a multiple of {lay.model_parallel} ranks (--resource {name} [1, N])"
               + (" or its own layout (--ref-actor-config '{\"tensor_model_parallel_size\": 1}')"
                  if name in SCORERS else ""))
        if workers % lay.model_parallel:
            raise PlanError(f"{name}: {workers} rank(s) do not split into tensor x pipeline x context parallel "
                            f"groups of {lay.tp} x {lay.pp} x {lay.cp}; {fix}")
        if workers % (lay.etp * lay.ep * lay.pp):
            raise PlanError(f"{name}: {workers} rank(s) do not split into expert tensor x expert parallel groups "
                            f"of {lay.etp} x {lay.ep} per pipeline stage ({lay.pp} stages); lower "
                            "--expert-tensor-parallel-size / --expert-model-parallel-size or add ranks")
