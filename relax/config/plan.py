"""The run plan: what a run deploys and how its data flows, resolved once from the config.

`resolve_plan(cfg, gpus)` turns the validated config into a `RunPlan`: the mode, the roles to
deploy (in order) with their workers, Ray CPUs/GPUs and placement, which role writes and which
roles read every TransferQueue column (`relax.types.COLUMNS`), who clears a step's partition,
and who receives weights. Each role's `RolePlan` comes from its own planner
(`relax.config.role_plans.ROLE_PLANNERS`, in deploy order); here they are placed on the GPUs and
the Actor's and the Rollout's parts derived. The Controller deploys by looping over `plan.roles`
and calls the roles that take a part in a step (`RunPlan.roles_with(StepPart.SCORES)`); each
role gets its own part (`ActorPlan`, `RolloutPlan`, `RolePlan`) and never tests the mode to
decide what to compute. `relax-train --dry-run` prints it (`format_plan`) before Ray starts, and
`check_cluster` compares it with the cluster's CPUs and GPUs before anything is deployed.

Colocate (sync): Rollout writes a step's rows; Reference / Teacher / Critic score them
(`forward`); the Actor computes old log-probs and advantages itself (whole-step loader),
trains, and writes `returns` for a critic; weights go to the engines. Fully async: Rollout,
Reference, Teacher, Critic, ActorFwd (old log-probs) and Advantages each stream over the
steps (`run`); the Actor's streaming loader trains micro-batches as rows complete, and weights
go to the engines and to ActorFwd's ranks. Both modes push weights through the DCS
coordinator, which lists the receivers.

No torch or ray import: the plan prints in well under a second.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from relax.config.autoscaler import load_autoscaler_config
from relax.config.checks.flags import ignored_flag_notes
from relax.config.checks.routing import routing_summary
from relax.config.elastic import serves_scaling_api
from relax.config.errors import PlanError
from relax.config.inert import inert_flag_notes
from relax.config.checks.megatron import megatron_notes
from relax.config.checks.optimizer import optimizer_notes
from relax.config.checks.profiling import train_profile_notes
from relax.config.layouts import check_role_layouts, ref_actor_notes
from relax.config.lora import lora_summary
from relax.config.placement import GpuAsk, GpuPlacement, PlacementError, place_gpus
from relax.config.placement import describe as describe_placement
from relax.config.role_plans import (
    REPLICA_CPUS, Device, RolePlan, StepPart, plan_roles, reference_in_actor, uses_critic,
)
from relax.config.roles import Role
from relax.config.schema import RelaxConfig
from relax.config.train_memory import keeps_old_actor, train_memory_notes
from relax.types import COLUMNS

Mode = Literal["colocate", "fully_async"]

# --advantage-estimator values whose advantages whiten over the whole batch (not group-local).
BATCH_ESTIMATORS = ("reinforce_plus_plus", "reinforce_plus_plus_baseline")
TQ_CONTROLLER_CPUS, TQ_STORAGE_CPUS = 1.0, 1.0  # TransferQueue's Ray actors (num_cpus=1 each)


@dataclass(frozen=True)
class ActorPlan:
    """The Actor's part: how it loads a step, what it computes itself, what it leaves behind."""

    role: RolePlan
    loader: Literal["whole_step", "streaming"]
    reads: tuple[str, ...]  # columns read from the step partition
    computes: tuple[str, ...]  # columns computed in the Actor (whole-step loader only)
    writes: tuple[str, ...]  # columns written back (returns for a colocate critic)
    # The PPO ratio's denominator: recomputed log-probs, the engine's, or the training forward's
    # own (detached) when the step is one on-policy pass (`reuses_training_log_probs`).
    old_policy: Literal["old_log_probs", "rollout_log_probs", "training_log_probs"]
    clears: bool  # the Actor is the step's last consumer
    passes: int  # --num-iters-per-train-update
    overlap_weight_push: bool  # a push overlaps the next step (fully async)
    pause_mode: Literal["abort", "in_place"]  # what engines do with requests in flight during a push
    max_staleness: int
    engine_push_every: int = 1  # --update-weights-interval: the engines take every N-th version (colocate)


@dataclass(frozen=True)
class RolloutPlan:
    """The Rollout's part."""

    role: RolePlan
    stream_groups: bool  # kept groups go to the partition as they finish
    overlapping_steps: bool  # steps overlap (engine busy time is reported since the last report)
    release_memory: bool  # engines release memory while the trainer runs (colocate offload)
    eval_waits_for_version: bool  # evaluation at step s waits until the engines hold version s
    max_staleness: int


@dataclass(frozen=True)
class RunPlan:
    """What a run deploys and how its data flows (`resolve_plan`); `format_plan` prints it."""

    mode: Mode
    train_backend: str
    rollout_backend: str
    device: Device
    roles: tuple[RolePlan, ...]  # in deploy and setup order
    actor: ActorPlan
    rollout: RolloutPlan
    columns: tuple[ColumnFlow, ...]
    clearer: Role  # the role that clears a trained step's partition
    weight_receivers: tuple[Role, ...]
    data_plane_cpus: float
    placement: GpuPlacement | None = None  # GPU clusters: the run's placement group (one bundle a GPU)
    offload_train: bool = False  # training ranks move their state to the host while the engines generate
    notes: tuple[str, ...] = field(default=())  # flags accepted here with no effect, and why

    def role(self, name: Role) -> RolePlan:
        for role in self.roles:
            if role.name == name:
                return role
        raise KeyError(f"the plan deploys no {str(name)!r} role (roles: {', '.join(r.name for r in self.roles)})")

    def has(self, name: Role) -> bool:
        return any(r.name == name for r in self.roles)

    def part(self, name: Role) -> Any:
        """What role `name` is constructed with: `ActorPlan`, `RolloutPlan`, else its `RolePlan`."""
        return {Role.ACTOR: self.actor, Role.ROLLOUT: self.rollout}.get(name) or self.role(name)

    def roles_with(self, part: StepPart) -> tuple[RolePlan, ...]:
        """The roles that take `part` in a step, in deploy order."""
        return tuple(r for r in self.roles if part in r.parts)

    @property
    def cpus(self) -> float:
        return round(sum(r.cpus for r in self.roles) + self.data_plane_cpus, 2)

    @property
    def gpus(self) -> float:
        """GPUs the run holds: its placement group's bundles (0 on CPU)."""
        return float(self.placement.bundles) if self.placement is not None else 0.0


# ---- what the Actor computes ------------------------------------------------------------------

def per_group_advantages(cfg: RelaxConfig) -> bool:
    """A group's advantages depend on its own rows only (no batch whitening)."""
    return cfg.algo.advantage_estimator not in BATCH_ESTIMATORS and not cfg.algo.normalize_advantages


def reuses_training_log_probs(cfg: RelaxConfig) -> bool:
    """Colocate, one optimizer step and one pass per rollout step, nothing but the loss reading
    the old log-probs: the old-policy forward would score the rows with exactly the weights the
    training forward has, so the training forward's detached log-probs are the old log-probs (the
    ratio is exactly 1) and the separate forward is skipped (--keep-old-actor: it scores the kept
    weights instead)."""
    total = (cfg.rollout.rollout_batch_size or 0) * cfg.rollout.n_samples_per_prompt
    return (not cfg.cluster.fully_async and not cfg.algo.use_rollout_logprobs
            and cfg.cluster.num_iters_per_train_update == 1 and cfg.batch.global_batch_size == total
            and cfg.algo.kl_coef == 0 and not cfg.algo.use_opd and not keeps_old_actor(cfg))


def _old_policy(cfg: RelaxConfig) -> Literal["old_log_probs", "rollout_log_probs", "training_log_probs"]:
    if cfg.algo.use_rollout_logprobs:
        return "rollout_log_probs"
    return "training_log_probs" if reuses_training_log_probs(cfg) else "old_log_probs"


@dataclass(frozen=True)
class ColumnFlow:
    """A TransferQueue column of the step partition: the role that writes it and those that read it."""

    name: str
    producer: Role
    consumers: tuple[Role, ...]


def _flows(cfg: RelaxConfig, roles: list[RolePlan]) -> tuple[ColumnFlow, ...]:
    """Producer and consumers of every column some role writes (the Actor computes in memory
    what no role writes: it is listed as the producer of nothing)."""
    producers = {c: r.name for r in roles for c in r.writes}
    return tuple(ColumnFlow(c, producers[c], tuple(r.name for r in roles if c in r.reads))
                 for c in COLUMNS if c in producers)


# ---- the plan ------------------------------------------------------------------------------

def resolve_plan(cfg: RelaxConfig, gpus: float = 0.0) -> RunPlan:
    """The plan of a validated config on a cluster with `gpus` GPUs (0: CPU processes): every
    role's planner in deploy order (`relax.config.role_plans`), then the GPUs placed."""
    device: Device = "gpu" if gpus > 0 else "cpu"
    critic = uses_critic(cfg)
    roles = plan_roles(cfg, device)
    placement = None
    if device == "gpu":
        placement = _place(roles, cfg.cluster.fully_async, gpus)
        roles = [dataclasses.replace(r, slots=placement.role_slots(r.name), gpu_fraction=placement.fraction)
                 if placement.role_slots(r.name) else r for r in roles]
    check_resource_roles(cfg, roles)
    check_role_layouts(cfg, [(r.name, r.workers, r.unit) for r in roles])
    by_name = {r.name: r for r in roles}
    return RunPlan(
        mode="fully_async" if cfg.cluster.fully_async else "colocate", train_backend=cfg.cluster.train_backend,
        rollout_backend=cfg.cluster.rollout_backend, device=device, roles=tuple(roles),
        actor=_actor_plan(cfg, by_name[Role.ACTOR]), rollout=_rollout_plan(cfg, by_name[Role.ROLLOUT]),
        columns=_flows(cfg, roles), clearer=Role.CRITIC if critic else Role.ACTOR,
        weight_receivers=tuple(r.name for r in roles if StepPart.RECEIVES_WEIGHTS in r.parts),
        data_plane_cpus=TQ_CONTROLLER_CPUS + TQ_STORAGE_CPUS * cfg.cluster.num_data_storage_units,
        placement=placement, offload_train=offload_train(cfg, device, placement),
        notes=tuple(ignored_flags(cfg, device)),
    )


def _place(roles: list[RolePlan], fully_async: bool, gpus: float) -> GpuPlacement:
    """Every rank and engine on the run's GPUs (`relax.config.placement`)."""
    asks = [GpuAsk(r.name, r.workers, r.gpus_each if r.unit == "engine" else 1, 1.0 if r.unit == "rank" else 0.0)
            for r in roles if r.unit in ("rank", "engine")]
    try:
        return place_gpus(asks, colocate=not fully_async, cluster_gpus=int(gpus))
    except PlacementError as exc:
        raise PlanError(str(exc)) from None


def _actor_plan(cfg: RelaxConfig, role: RolePlan) -> ActorPlan:
    fully_async, critic, old_policy = cfg.cluster.fully_async, uses_critic(cfg), _old_policy(cfg)
    advantages = () if cfg.algo.disable_compute_advantages_and_returns else ("advantages",) + (
        ("returns",) if critic else ())  # (SFT or a custom loss trains without them)
    reference = ("ref_log_probs",) if reference_in_actor(cfg) else ()  # --lora-rank: the adapter switched off
    computes = () if fully_async else (("old_log_probs",) if old_policy == "old_log_probs" else ()) + reference + \
        advantages
    return ActorPlan(
        role=role, loader="streaming" if fully_async else "whole_step", reads=role.reads,
        computes=computes, writes=("returns",) if critic and not fully_async else (), old_policy=old_policy,
        clears=not critic, passes=cfg.cluster.num_iters_per_train_update, overlap_weight_push=fully_async,
        pause_mode="abort" if cfg.rollout.partial_rollout else "in_place", max_staleness=staleness(cfg),
        engine_push_every=cfg.rollout.update_weights_interval)


def staleness(cfg: RelaxConfig) -> int:
    """Weight versions a trained row may lag: --max-staleness in fully async mode; colocate is
    on-policy whatever it says (it accepts 0 and 1, the seeds' two spellings of on-policy), unless
    --update-weights-interval N leaves the engines up to N - 1 versions behind."""
    return cfg.cluster.max_staleness if cfg.cluster.fully_async else cfg.rollout.update_weights_interval - 1


def _rollout_plan(cfg: RelaxConfig, role: RolePlan) -> RolloutPlan:
    fully_async = cfg.cluster.fully_async
    streamable = cfg.reward.custom_reward_post_process_path is None and \
        cfg.reward.custom_convert_samples_to_train_data_path is None
    return RolloutPlan(role=role, stream_groups=fully_async and streamable, overlapping_steps=fully_async,
                       release_memory=releases_engine_memory(cfg) and not cfg.rollout.rollout_external,
                       eval_waits_for_version=fully_async, max_staleness=staleness(cfg))


def check_resource_roles(cfg: RelaxConfig, roles: list[RolePlan]) -> None:
    """Every `--resource` entry names a role this run deploys (an entry for a role the mode or
    the flags leave out would be silently unused)."""
    deployed = {r.name for r in roles}
    why = {Role.ACTOR_FWD: "ActorFwd (old log-probs) runs only with --fully-async and without --use-rollout-logprobs",
           Role.ADVANTAGES: "the Advantages role runs only with --fully-async",
           Role.REFERENCE: "the Reference runs only with --use-kl-loss or --kl-coef",
           Role.TEACHER: "the Teacher runs only with --use-opd (its ranks, or its engines with --opd-type sglang)",
           Role.CRITIC: "the Critic runs only with --advantage-estimator ppo",
           Role.GENRM: "GenRM engines are sized by --genrm-num-gpus / --genrm-num-gpus-per-engine"}
    for name in cfg.cluster.resource:
        if name == Role.GENRM or (name not in deployed and name in why):
            raise PlanError(f"--resource {name}: {why[name]}; drop the entry (or enable the role)")
    teacher = next((r for r in roles if r.name == Role.TEACHER), None)
    if Role.TEACHER in cfg.cluster.resource and teacher is not None and not teacher.workers:
        raise PlanError("--resource teacher: the OPD teacher is the external server at --rm-url, so Relax launches "
                        "no teacher engine; drop the entry (or launch it with --opd-teacher-load DIR)")


# ---- flags this run accepts without effect ---------------------------------------------------

def offload_train(cfg: RelaxConfig, device: Device, placement: GpuPlacement | None) -> bool:
    """Colocate on GPUs: the training ranks move their state to the host while the engines
    generate, unless --no-offload-train (fully async never offloads: validated)."""
    c = cfg.cluster
    wanted = c.offload or (c.offload_train if c.offload_train is not None else not c.fully_async)
    return bool(wanted and device == "gpu" and placement is not None and placement.shared and not c.fully_async)


def releases_engine_memory(cfg: RelaxConfig) -> bool:
    """Colocate: engines release weights and KV cache while the trainer runs, unless --no-offload-rollout."""
    c = cfg.cluster
    return not c.fully_async and (c.offload or c.offload_rollout is not False)


def ignored_flags(cfg: RelaxConfig, device: Device) -> list[str]:
    """A note for every flag set to a non-default value that this run accepts but does not act on,
    with the reason; the run logs them at start and `--dry-run` prints them. Flags that would be
    silently wrong are rejected instead (`PlanError`)."""
    c, notes = cfg.cluster, []
    if device == "cpu" and (c.offload or c.offload_train):
        notes.append("--offload/--offload-train: on CPU there is no device memory to free; the ranks keep their "
                     "state (engines still release theirs around training)")
    notes += ignored_flag_notes(cfg) + inert_flag_notes(cfg) + ref_actor_notes(cfg) + optimizer_notes(cfg, device)
    notes += megatron_notes(cfg)
    notes += train_profile_notes(cfg, device) + train_memory_notes(cfg, device)
    if not c.fully_async and c.max_staleness == 1:
        notes.append("--max-staleness 1: colocate mode is on-policy (rollout never runs ahead of training), as the "
                     "seeds' colocate scripts mean it; the same as 0")
    if device == "cpu" and cfg.optim.bf16:
        notes.append("--bf16: training runs in float32 on CPU")
    return notes


# ---- against the cluster --------------------------------------------------------------------

def check_cluster(plan: RunPlan, resources: dict[str, float]) -> None:
    """Fail before anything is deployed when the cluster cannot hold the plan (Ray would wait
    for the missing CPUs or GPUs forever), naming what each role asks for."""
    have_cpu, have_gpu = float(resources.get("CPU", 0)), float(resources.get("GPU", 0))
    asks = ", ".join(f"{r.name} {_amount(r)}" for r in plan.roles if r.gpus or r.unit == "rank")
    if plan.gpus > have_gpu + 1e-9:
        how = ("colocate shares them between the trainer and the engines" if plan.mode == "colocate" else
               "fully async gives each role GPUs of its own when there are enough")
        raise PlanError(
            f"the run needs {plan.gpus:g} GPUs ({asks}) but the Ray cluster has {have_gpu:g} ({how}). Lower the "
            "--resource entries or add GPUs")
    if plan.cpus > have_cpu + 1e-9:
        raise PlanError(
            f"the run needs {plan.cpus:g} Ray CPUs ({asks}, {plan.data_plane_cpus:g} for TransferQueue, "
            f"{REPLICA_CPUS:g} per role replica) but the Ray cluster has {have_cpu:g}. Start Ray with more logical "
            "CPUs (--ray-num-cpus N for a local cluster, or `ray start --num-cpus N`) or lower the --resource entries")


def _amount(role: RolePlan) -> str:
    unit = f"{role.workers} {role.unit}{'s' if role.workers != 1 else ''}" if role.unit else "service"
    gpus = len({b for slot in role.slots for b in slot})
    return f"{unit} on {gpus} GPU{'s' if gpus != 1 else ''}" if role.slots else f"{unit} = {role.cpus:g} CPU"


# ---- printing --------------------------------------------------------------------------------

def format_plan(plan: RunPlan, cfg: RelaxConfig | None = None) -> str:
    """The plan as `relax-train --dry-run` prints it."""
    lines = [f"mode: {plan.mode}   backends: {plan.train_backend} (train) / {plan.rollout_backend} (rollout)   "
             f"device: {plan.device}", "", "roles (deploy order):",
             f"  {'role':<11}{'workers':<22}{'Ray CPUs':>9}{'GPUs':>6}  part in a step"]
    for r in plan.roles:
        workers = f"{r.workers} {r.unit}{'s' if r.workers != 1 else ''}" if r.unit else "-"
        if r.unit == "engine" and plan.device == "cpu":
            workers += " (processes)"
        elif r.unit == "engine" and r.gpus_each > 1:
            workers += f" (tp {r.gpus_each})"
        lines.append(f"  {r.name:<11}{workers:<22}{r.cpus:>9.1f}{r.gpus:>6g}  {_part(plan, r)}")
    lines += [f"  {'TransferQueue':<33}{plan.data_plane_cpus:>9.1f}{0:>6}  data plane (controller + storage)",
              f"  {'total':<33}{plan.cpus:>9.1f}{plan.gpus:>6g}", "", "columns of partition train_{step}:"]
    width = max([19] + [len(flow.name) + 2 for flow in plan.columns])
    lines.append(f"  {'column':<{width}}{'dtype':<9}{'shape':<7}{'written by':<12}read by")
    for flow in plan.columns:
        col = COLUMNS[flow.name]
        consumers = ", ".join(flow.consumers) or "-"
        lines.append(f"  {col.name:<{width}}{col.dtype:<9}{col.shape:<7}{flow.producer:<12}{consumers}")
    a = plan.actor
    computed = ", ".join(a.computes) or "nothing (every column arrives from the other roles)"
    balanced = "; each step's rows balanced by tokens over the ranks" if cfg and cfg.batch.balance_data else ""
    lines += ["", f"actor: {a.loader.replace('_', '-')} loader; computes {computed}; old policy = {a.old_policy}; "
                  f"{a.passes} pass(es) over each step{balanced}",
              f"partition cleared by: {plan.clearer} (after training the step)",
              f"weights: actor rank 0 -> {_receivers(plan)} through the DCS coordinator"
              + (", overlapping the next step" if a.overlap_weight_push else
                 f", after every {a.engine_push_every} steps" if a.engine_push_every > 1 else ", after every step")]
    if plan.placement is not None:
        lines.append(f"GPUs: {describe_placement(plan.placement)}"
                     + ("; training ranks offload to the host during rollout" if plan.offload_train else ""))
    if plan.mode == "fully_async":
        lines.append(f"staleness: rollout runs at most {a.max_staleness} weight version(s) ahead of training")
    if cfg is not None:
        lines += _generation(cfg) + lora_summary(cfg) + routing_summary(cfg) + scaling_lines(cfg) + \
            [f"outputs: {cfg.misc.exp_dir}"]
    lines += [f"note: {n}" for n in plan.notes]
    return "\n".join(lines)


def scaling_lines(cfg: RelaxConfig) -> list[str]:
    """Where the scaling REST API is served (by the Rollout role, which owns the engine fleet) and what the
    autoscaler does (docs/elastic-scaling.md)."""
    e = cfg.elastic
    if not serves_scaling_api(cfg):
        return []
    port = e.scale_api_port or "<free port>"
    lines = [f"scaling API: http://{e.scale_api_host}:{port}, served by the Rollout role (bearer token in "
             f"<outputs>/.relax/scale_token; relax-scale --exp-dir {cfg.misc.exp_dir} status)"]
    if e.autoscaler_config:
        a = load_autoscaler_config(e.autoscaler_config)
        lines.append(f"autoscaler: {e.autoscaler_config}: {a.min_engines}-{a.max_engines} engines, {a.target_metric} "
                     f"> {a.scale_out_threshold:g} grows / < {a.scale_in_threshold:g} shrinks by {a.step_size}, "
                     f"cooldown {a.cooldown_s:g}s, a decision every {a.interval_s:g}s")
    return lines


def _generation(cfg: RelaxConfig) -> list[str]:
    """How samples are generated, when it is not the default single turn (docs/agentic.md)."""
    a, custom = cfg.agentic, cfg.rollout.custom_generate_function_path
    logs = ", trajectories -> <outputs>/multi_turn/" if cfg.logging.log_multi_turn else ""
    if a.agent_function_path:
        return [f"generation: black-box agent {a.agent_function_path} via the gateway on {a.agent_gateway_host}, "
                f"at most {a.agent_timeout:g} s per episode" + logs]
    if a.rollout_interaction_env_path:
        return [f"generation: {'multi-turn rollout' if not custom else custom}, environment "
                f"{a.rollout_interaction_env_path}, at most {a.max_turns} turns" + logs]
    return [f"generation: {custom}"] if custom else []


def _receivers(plan: RunPlan) -> str:
    """The weight receivers, each with its cadence when it is not every version."""
    every = {r.name: r.weights_every for r in plan.roles}
    return ", ".join(f"{name}" + (f" (every {every[name]} versions)" if every[name] > 1 else "")
                     for name in plan.weight_receivers) or "nobody"


def _part(plan: RunPlan, r: RolePlan) -> str:
    if r.name == Role.DCS:
        return "weight-sync coordinator (receivers, versions)"
    if r.name == Role.METRICS:
        return "metrics service: every role's reports -> the metrics sinks"
    if r.name == Role.GENRM:
        return "judge engines behind a router (rm-type genrm)"
    if r.name == Role.ACTOR:
        return "trains each step, pushes weights" if r.workers else "consumes steps untrained (--debug-rollout-only)"
    verbs = []
    if r.name == Role.ROLLOUT:
        verbs.append("generates and scores samples" + (", streams them" if StepPart.STREAMS in r.parts else ""))
    elif StepPart.STREAMS in r.parts:
        verbs.append(f"streams {', '.join(r.writes)} onto rows as they arrive")
    elif StepPart.SCORES in r.parts:
        verbs.append(f"writes {', '.join(r.writes)} after the rollout")
    if StepPart.TRAINS_AFTER_ACTOR in r.parts:
        verbs.append("trains after the actor")
    return "; ".join(verbs)


def plan_summary(plan: RunPlan) -> dict[str, Any]:
    """The plan as plain data (for logs and tests)."""
    return dataclasses.asdict(plan)
