"""Which roles a config deploys, and each one's part of the run plan (`RolePlan`).

One planner function per role returns its `RolePlan` (None: the config does not deploy it);
`ROLE_PLANNERS` lists them in deploy order, and `relax.config.plan.resolve_plan` runs them, then
places the GPUs. A `RolePlan` says how many workers the role has and of what kind, what it
reserves, which TransferQueue columns it writes and reads, and its part in a step (`StepPart`):
the Controller calls a role for what its parts say and never tests the mode itself.

No torch or ray import: the plan prints in well under a second.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Callable, Literal

from relax.config.errors import PlanError
from relax.config.roles import Role
from relax.config.schema import RelaxConfig
from relax.types import MEDIA_COLUMN, ROLLOUT_COLUMNS, ROUTING_COLUMN

Device = Literal["cpu", "gpu"]
REPLICA_CPUS = 0.1  # each role's Serve replica
REWARD_WORKER_CPUS = 0.1  # each reward worker actor (relax.engine.rewards.worker.ray_pool)


class StepPart(enum.Flag):
    """What the Controller calls a role for in a step."""

    SCORES = enum.auto()  # colocate: `forward(step)` after the rollout
    STREAMS = enum.auto()  # fully async: its own `run(start, end)` loop over the steps
    TRAINS_AFTER_ACTOR = enum.auto()  # `train(step)` right after the Actor's
    RECEIVES_WEIGHTS = enum.auto()  # registers weight receivers with the DCS coordinator
    CHECKPOINTS = enum.auto()  # saves its state with every checkpoint


@dataclass(frozen=True)
class RolePlan:
    """One deployed role: its workers, what it reserves and how it takes part in a step (`parts`)."""

    name: Role
    workers: int = 0
    unit: str = ""  # "rank" (training-backend process), "engine" (inference server), "external engine" or ""
    gpus_each: int = 1  # GPUs per engine (tensor parallel size); ranks use one
    # On a GPU cluster (`relax.config.placement`): per worker, the run's placement-group bundles
    # (GPUs) it runs on, and the fraction of each that its process reserves.
    slots: tuple[tuple[int, ...], ...] = ()
    gpu_fraction: float = 0.0
    writes: tuple[str, ...] = ()
    reads: tuple[str, ...] = ()
    parts: StepPart = StepPart(0)
    reward_workers: int = 0  # reward worker actors (0.1 CPU each) the role may start
    weights_every: int = 1  # RECEIVES_WEIGHTS: every how many weight versions it takes the actor's

    @property
    def cpus(self) -> float:
        ranks = self.workers if self.unit == "rank" else 0
        return REPLICA_CPUS + ranks + REWARD_WORKER_CPUS * self.reward_workers

    @property
    def gpus(self) -> float:
        """GPUs this role's processes reserve in Ray (fractions of shared GPUs add up)."""
        return round(sum(len(s) for s in self.slots) * self.gpu_fraction, 2)


# ---- which roles a config deploys ----------------------------------------------------------

def needs_reference(cfg: RelaxConfig) -> bool:
    """A reference model scores every row for the KL loss or KL reward shaping."""
    return cfg.algo.use_kl_loss or cfg.algo.kl_coef != 0


def reference_in_actor(cfg: RelaxConfig) -> bool:
    """--lora-rank: the reference is the actor's base model with the adapter off, scored by the
    actor's own ranks (no Reference role, no second copy of the weights; docs/lora.md)."""
    return needs_reference(cfg) and cfg.lora.lora_rank > 0


def uses_critic(cfg: RelaxConfig) -> bool:
    """A critic (value model) gives GAE advantages."""
    return cfg.algo.advantage_estimator == "ppo"


def needs_teacher(cfg: RelaxConfig) -> bool:
    return cfg.algo.use_opd


def needs_genrm(cfg: RelaxConfig) -> bool:
    return bool(cfg.reward.genrm_model_path)


def needs_actor_fwd(cfg: RelaxConfig) -> bool:
    """Fully async: old log-probs come from ActorFwd unless the engine's are used."""
    return cfg.cluster.fully_async and not cfg.algo.use_rollout_logprobs


def _ranks(cfg: RelaxConfig, role: Role) -> int:
    return (cfg.cluster.resource.get(role) or [1, 1])[1] or 1


def rollout_engines(cfg: RelaxConfig, gpus_per_engine: int) -> int:
    """`--resource rollout [_, N]` gives the rollout's GPUs (processes on CPU); an engine takes
    `--rollout-num-gpus-per-engine` of them."""
    n = cfg.cluster.resource[Role.ROLLOUT][1]
    if n % gpus_per_engine:
        raise PlanError(f"--resource rollout asks for {n} GPUs, not a multiple of --rollout-num-gpus-per-engine "
                        f"{gpus_per_engine} (each engine takes that many); make them divide")
    return n // gpus_per_engine


# ---- what the roles read -------------------------------------------------------------------

# --advantage-estimator values with one advantage per sample (relax.algorithms.advantages.SEQUENCE_ESTIMATORS).
SEQUENCE_ESTIMATORS = ("grpo", "gspo", "sapo", "on_policy_distillation")


def trains_prior_segments(cfg: RelaxConfig) -> bool:
    """`--agent-segments`: whether the prior segments of an episode (Sample.prior_segments) are
    training rows of their own (all; auto: when the estimator gives one advantage per sample). Only
    a black-box agent or a custom generate function makes them."""
    makes = bool(cfg.agentic.agent_function_path or cfg.rollout.custom_generate_function_path)
    return makes and segments_train(cfg.agentic.agent_segments, cfg.algo.advantage_estimator, cfg.algo.kl_coef)


def segments_train(mode: str, estimator: str, kl_coef: float) -> bool:
    """`trains_prior_segments` from the three flags it reads."""
    return mode == "all" or (mode == "auto" and estimator in SEQUENCE_ESTIMATORS and kl_coef == 0)


def _episodes(cfg: RelaxConfig) -> tuple[str, ...]:
    """With prior segments as rows, advantages need each row's episode (and the episode's row count
    to know a group is complete while streaming)."""
    return ("sample_indices", "episode_indices", "episode_rows") if trains_prior_segments(cfg) else ()


def advantage_inputs(cfg: RelaxConfig) -> tuple[str, ...]:
    """The columns advantages are computed from (estimator, KL shaping, OPD penalty)."""
    old = "rollout_log_probs" if cfg.algo.use_rollout_logprobs else "old_log_probs"
    cols = ["rewards", "loss_masks", "response_lengths", "group_indices"] + (["values"] if uses_critic(cfg) else [])
    if cfg.algo.kl_coef != 0:
        cols += ["ref_log_probs", old]
    if cfg.algo.use_opd:
        cols += ["teacher_log_probs", old]
    return tuple(dict.fromkeys(cols + list(_episodes(cfg))))


def _media(cfg: RelaxConfig) -> tuple[str, ...]:
    """A multimodal run's rows carry their encoder tensors to every model forward."""
    return (MEDIA_COLUMN,) if cfg.data.multimodal_keys else ()


def _routing(cfg: RelaxConfig) -> tuple[str, ...]:
    """R3: rows carry the engines' routing records to every forward of the policy's model (the
    Actor's, ActorFwd's, the Reference's; not a critic's or a teacher's, other models)."""
    return (ROUTING_COLUMN,) if cfg.algo.use_rollout_routing_replay else ()


def _scorer_reads(cfg: RelaxConfig) -> tuple[str, ...]:
    """Streaming readers key rows by their sample index; whole-step readers list the partition's keys."""
    return ("tokens", "response_lengths") + _media(cfg) + (("sample_indices",) if cfg.cluster.fully_async else ())


def _scoring(cfg: RelaxConfig) -> StepPart:
    """A scorer's part: called after the rollout (colocate) or running its own loop (fully async)."""
    return StepPart.STREAMS if cfg.cluster.fully_async else StepPart.SCORES


def _actor_reads(cfg: RelaxConfig) -> tuple[str, ...]:
    fully_async = cfg.cluster.fully_async
    reads = ["tokens", "response_lengths", "loss_masks", "rollout_log_probs", "rewards", "weight_versions",
             *_media(cfg), *_routing(cfg)]
    if needs_reference(cfg) and not reference_in_actor(cfg):
        reads.append("ref_log_probs")
    if needs_teacher(cfg):
        reads.append("teacher_log_probs")
    if uses_critic(cfg) and not fully_async:
        reads.append("values")
    if fully_async:  # written by ActorFwd and Advantages
        reads += ["advantages"] + (["old_log_probs"] if needs_actor_fwd(cfg) else [])
    reads += _episodes(cfg)  # colocate: for the advantages; both: in the dumped batch (--save-debug-train-data)
    return tuple(dict.fromkeys(reads))


# ---- one planner per role --------------------------------------------------------------------

# (config, device) -> the role's plan, or None when the config does not deploy the role.
RolePlanner = Callable[[RelaxConfig, Device], "RolePlan | None"]


def plan_metrics(cfg: RelaxConfig, device: Device) -> RolePlan | None:
    return RolePlan(Role.METRICS) if cfg.logging.use_metrics_service else None


def plan_genrm(cfg: RelaxConfig, device: Device) -> RolePlan | None:
    r = cfg.reward
    if not needs_genrm(cfg):
        return None
    judges = max(1, r.genrm_num_gpus // max(1, r.genrm_num_gpus_per_engine))
    return RolePlan(Role.GENRM, judges, "engine", gpus_each=r.genrm_num_gpus_per_engine)


def plan_actor(cfg: RelaxConfig, device: Device) -> RolePlan:
    writes_returns = uses_critic(cfg) and not cfg.cluster.fully_async  # for a colocate critic
    return RolePlan(Role.ACTOR, 0 if cfg.debug.debug_rollout_only else _ranks(cfg, Role.ACTOR), "rank",
                    reads=_actor_reads(cfg), writes=("returns",) if writes_returns else (),
                    parts=StepPart.CHECKPOINTS)


def plan_rollout(cfg: RelaxConfig, device: Device) -> RolePlan:
    external = cfg.rollout.rollout_external  # engines already running: none launched, no GPUs reserved
    debug_train = cfg.debug.debug_train_only
    tp = cfg.cluster.rollout_num_gpus_per_engine if device == "gpu" and not external else 1
    if tp > 1 and cfg.cluster.rollout_backend == "hf":
        raise PlanError(f"--rollout-num-gpus-per-engine {tp}: an hf engine runs on one GPU (tensor parallelism is "
                        "SGLang's); use --rollout-backend sglang or 1 GPU per engine")
    engines = len(cfg.rollout.rollout_external_engine_addrs or ()) if external else rollout_engines(cfg, tp)
    unit = "" if debug_train else "external engine" if external else "engine"
    parts = StepPart.CHECKPOINTS | (StepPart.STREAMS if cfg.cluster.fully_async else StepPart(0)) | (
        StepPart(0) if debug_train else StepPart.RECEIVES_WEIGHTS)
    return RolePlan(Role.ROLLOUT, 0 if debug_train else engines, unit, gpus_each=tp,
                    writes=ROLLOUT_COLUMNS + _media(cfg) + _routing(cfg), parts=parts,
                    reward_workers=cfg.reward.reward_num_workers)


def plan_reference(cfg: RelaxConfig, device: Device) -> RolePlan | None:
    """--ref-update-interval N: it takes every N-th of the actor's weight versions (pushed as to
    ActorFwd, a lane of its own at the DCS coordinator)."""
    if not needs_reference(cfg) or reference_in_actor(cfg):
        return None
    every = cfg.algo.ref_update_interval or 0
    refreshed = StepPart.RECEIVES_WEIGHTS if every else StepPart(0)
    return RolePlan(Role.REFERENCE, _ranks(cfg, Role.REFERENCE), "rank", writes=("ref_log_probs",),
                    reads=_scorer_reads(cfg) + _routing(cfg), parts=_scoring(cfg) | refreshed,
                    weights_every=max(every, 1))


def plan_teacher(cfg: RelaxConfig, device: Device) -> RolePlan | None:
    """--opd-type sglang: engines (none for an external one at --rm-url); megatron: ranks."""
    if not needs_teacher(cfg):
        return None
    engine = cfg.algo.opd_type == "sglang"
    launched = not engine or bool(cfg.algo.opd_teacher_load)
    return RolePlan(Role.TEACHER, _ranks(cfg, Role.TEACHER) if launched else 0, "engine" if engine else "rank",
                    writes=("teacher_log_probs",), reads=_scorer_reads(cfg), parts=_scoring(cfg))


def plan_critic(cfg: RelaxConfig, device: Device) -> RolePlan | None:
    if not uses_critic(cfg):
        return None
    return RolePlan(Role.CRITIC, _ranks(cfg, Role.CRITIC), "rank", writes=("values",),
                    reads=_scorer_reads(cfg) + ("loss_masks", "values", "returns"),
                    parts=_scoring(cfg) | StepPart.TRAINS_AFTER_ACTOR | StepPart.CHECKPOINTS)


def plan_actor_fwd(cfg: RelaxConfig, device: Device) -> RolePlan | None:
    if not needs_actor_fwd(cfg):
        return None
    return RolePlan(Role.ACTOR_FWD, _ranks(cfg, Role.ACTOR_FWD), "rank", writes=("old_log_probs",),
                    reads=_scorer_reads(cfg) + _routing(cfg) + ("weight_versions",),
                    parts=StepPart.STREAMS | StepPart.RECEIVES_WEIGHTS)


def plan_advantages(cfg: RelaxConfig, device: Device) -> RolePlan | None:
    if not cfg.cluster.fully_async:
        return None
    return RolePlan(Role.ADVANTAGES, writes=("advantages",) + (("returns",) if uses_critic(cfg) else ()),
                    reads=advantage_inputs(cfg) + ("sample_indices",), parts=StepPart.STREAMS)


def plan_dcs(cfg: RelaxConfig, device: Device) -> RolePlan:
    return RolePlan(Role.DCS)


# Deploy (and setup) order.
ROLE_PLANNERS: dict[Role, RolePlanner] = {
    Role.METRICS: plan_metrics,  # first: up before any role reports to it
    Role.GENRM: plan_genrm,  # before the Rollout: its rewards need the judge's router
    Role.ACTOR: plan_actor,
    Role.ROLLOUT: plan_rollout,
    Role.REFERENCE: plan_reference,
    Role.TEACHER: plan_teacher,
    Role.CRITIC: plan_critic,
    Role.ACTOR_FWD: plan_actor_fwd,
    Role.ADVANTAGES: plan_advantages,
    Role.DCS: plan_dcs,
}


def plan_roles(cfg: RelaxConfig, device: Device) -> list[RolePlan]:
    """Every role the config deploys, in deploy order, not yet placed on GPUs."""
    return [role for planner in ROLE_PLANNERS.values() if (role := planner(cfg, device)) is not None]
