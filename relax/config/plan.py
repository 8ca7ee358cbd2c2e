"""The run plan: what a run deploys and how its data flows, resolved once from the config.

`resolve_plan(cfg, gpus)` turns the validated config into a `RunPlan`: the mode, the roles to
deploy (in order) with their workers, Ray CPUs/GPUs and placement, which role writes and which
roles read every TransferQueue column (`relax.types.COLUMNS`), who clears a step's partition,
and who receives weights. The Controller deploys by looping over `plan.roles`; each role gets
its own part (`ActorPlan`, `RolloutPlan`, `RolePlan`) and never tests the mode to decide what
to compute. `relax-train --dry-run` prints it (`format_plan`) before Ray starts, and
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
import os
from dataclasses import dataclass, field
from typing import Any, Literal

from relax.config.placement import GpuAsk, GpuPlacement, PlacementError, place_gpus
from relax.config.placement import describe as describe_placement
from relax.config.schema import RelaxConfig
from relax.types import COLUMNS, MEDIA_COLUMN, ROLLOUT_COLUMNS

Mode = Literal["colocate", "fully_async"]

# --advantage-estimator values whose advantages whiten over the whole batch (not group-local).
BATCH_ESTIMATORS = ("reinforce_plus_plus", "reinforce_plus_plus_baseline")
TQ_CONTROLLER_CPUS, TQ_STORAGE_CPUS = 1.0, 1.0  # TransferQueue's Ray actors (num_cpus=1 each)
REPLICA_CPUS = 0.1  # each role's Serve replica
REWARD_WORKER_CPUS = 0.1  # each reward worker actor (relax.engine.rewards.worker.ray_pool)


class PlanError(ValueError):
    """The config asks for something this run cannot do (mode/flag combination, cluster size)."""


@dataclass(frozen=True)
class RolePlan:
    """One deployed role: its workers, what it reserves and how it takes part in a step.

    `scores`: colocate calls `forward(step)` after the rollout; `streams`: fully async runs its
    `run(start, end)` loop; `trains_after_actor`: `train(step)` right after the Actor's."""

    name: str
    workers: int = 0
    unit: str = ""  # "rank" (training-backend process), "engine" (inference server), "external engine" or ""
    gpus_each: int = 1  # GPUs per engine (tensor parallel size); ranks use one
    # On a GPU cluster (`relax.config.placement`): per worker, the run's placement-group bundles
    # (GPUs) it runs on, and the fraction of each that its process reserves.
    slots: tuple[tuple[int, ...], ...] = ()
    gpu_fraction: float = 0.0
    writes: tuple[str, ...] = ()
    reads: tuple[str, ...] = ()
    scores: bool = False
    streams: bool = False
    trains_after_actor: bool = False
    receives_weights: bool = False
    checkpoints: bool = False  # saves its state with every checkpoint
    reward_workers: int = 0  # reward worker actors (0.1 CPU each) the role may start

    @property
    def cpus(self) -> float:
        ranks = self.workers if self.unit == "rank" else 0
        return REPLICA_CPUS + ranks + REWARD_WORKER_CPUS * self.reward_workers

    @property
    def gpus(self) -> float:
        """GPUs this role's processes reserve in Ray (fractions of shared GPUs add up)."""
        return round(sum(len(s) for s in self.slots) * self.gpu_fraction, 2)


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
class ColumnFlow:
    name: str
    producer: str
    consumers: tuple[str, ...]


@dataclass(frozen=True)
class RunPlan:
    mode: Mode
    train_backend: str
    rollout_backend: str
    device: Literal["cpu", "gpu"]
    roles: tuple[RolePlan, ...]  # in deploy and setup order
    actor: ActorPlan
    rollout: RolloutPlan
    columns: tuple[ColumnFlow, ...]
    clearer: str  # the role that clears a trained step's partition
    weight_receivers: tuple[str, ...]
    data_plane_cpus: float
    placement: GpuPlacement | None = None  # GPU clusters: the run's placement group (one bundle a GPU)
    offload_train: bool = False  # training ranks move their state to the host while the engines generate
    notes: tuple[str, ...] = field(default=())  # flags accepted here with no effect, and why

    def role(self, name: str) -> RolePlan:
        for role in self.roles:
            if role.name == name:
                return role
        raise KeyError(f"the plan deploys no {name!r} role (roles: {', '.join(r.name for r in self.roles)})")

    def has(self, name: str) -> bool:
        return any(r.name == name for r in self.roles)

    def part(self, name: str) -> Any:
        """What role `name` is constructed with: `ActorPlan`, `RolloutPlan`, else its `RolePlan`."""
        return {"actor": self.actor, "rollout": self.rollout}.get(name) or self.role(name)

    @property
    def cpus(self) -> float:
        return round(sum(r.cpus for r in self.roles) + self.data_plane_cpus, 2)

    @property
    def gpus(self) -> float:
        """GPUs the run holds: its placement group's bundles (0 on CPU)."""
        return float(self.placement.bundles) if self.placement is not None else 0.0


# ---- which roles a config deploys ----------------------------------------------------------

def needs_reference(cfg: RelaxConfig) -> bool:
    """A reference model scores every row for the KL loss or KL reward shaping."""
    return cfg.algo.use_kl_loss or cfg.algo.kl_coef != 0


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


def per_group_advantages(cfg: RelaxConfig) -> bool:
    """A group's advantages depend on its own rows only (no batch whitening)."""
    return cfg.algo.advantage_estimator not in BATCH_ESTIMATORS and not cfg.algo.normalize_advantages


def _ranks(cfg: RelaxConfig, role: str) -> int:
    return (cfg.cluster.resource.get(role) or [1, 1])[1] or 1


def rollout_engines(cfg: RelaxConfig, gpus_per_engine: int) -> int:
    """`--resource rollout [_, N]` gives the rollout's GPUs (processes on CPU); an engine takes
    `--rollout-num-gpus-per-engine` of them."""
    n = cfg.cluster.resource["rollout"][1]
    if n % gpus_per_engine:
        raise PlanError(f"--resource rollout asks for {n} GPUs, not a multiple of --rollout-num-gpus-per-engine "
                        f"{gpus_per_engine} (each engine takes that many); make them divide")
    return n // gpus_per_engine


# ---- columns -------------------------------------------------------------------------------

def reuses_training_log_probs(cfg: RelaxConfig) -> bool:
    """Colocate, one optimizer step and one pass per rollout step, nothing but the loss reading
    the old log-probs: the old-policy forward would score the rows with exactly the weights the
    training forward has, so the training forward's detached log-probs are the old log-probs (the
    ratio is exactly 1) and the separate forward is skipped."""
    total = (cfg.rollout.rollout_batch_size or 0) * cfg.rollout.n_samples_per_prompt
    return (not cfg.cluster.fully_async and not cfg.algo.use_rollout_logprobs
            and cfg.cluster.num_iters_per_train_update == 1 and cfg.batch.global_batch_size == total
            and cfg.algo.kl_coef == 0 and not cfg.algo.use_opd)


def advantage_inputs(cfg: RelaxConfig) -> tuple[str, ...]:
    """The columns advantages are computed from (estimator, KL shaping, OPD penalty)."""
    old = "rollout_log_probs" if cfg.algo.use_rollout_logprobs else "old_log_probs"
    cols = ["rewards", "loss_masks", "response_lengths", "group_indices"] + (["values"] if uses_critic(cfg) else [])
    if cfg.algo.kl_coef != 0:
        cols += ["ref_log_probs", old]
    if cfg.algo.use_opd:
        cols += ["teacher_log_probs", old]
    return tuple(dict.fromkeys(cols))


def _flows(cfg: RelaxConfig, roles: list[RolePlan]) -> tuple[ColumnFlow, ...]:
    """Producer and consumers of every column some role writes (the Actor computes in memory
    what no role writes: it is listed as the producer of nothing)."""
    producers = {c: r.name for r in roles for c in r.writes}
    return tuple(ColumnFlow(c, producers[c], tuple(r.name for r in roles if c in r.reads))
                 for c in COLUMNS if c in producers)


# ---- the plan ------------------------------------------------------------------------------

def resolve_plan(cfg: RelaxConfig, gpus: float = 0.0) -> RunPlan:
    """The plan of a validated config on a cluster with `gpus` GPUs (0: CPU processes)."""
    mode: Mode = "fully_async" if cfg.cluster.fully_async else "colocate"
    device = "gpu" if gpus > 0 else "cpu"
    fully_async = mode == "fully_async"
    old_policy = "rollout_log_probs" if cfg.algo.use_rollout_logprobs else \
        "training_log_probs" if reuses_training_log_probs(cfg) else "old_log_probs"
    critic = uses_critic(cfg)

    roles: list[RolePlan] = []
    if needs_genrm(cfg):  # first: the Rollout's rewards need the judge's router
        judges = max(1, cfg.reward.genrm_num_gpus // max(1, cfg.reward.genrm_num_gpus_per_engine))
        roles.append(RolePlan("genrm", judges, "engine", gpus_each=cfg.reward.genrm_num_gpus_per_engine))
    # A multimodal run's rows carry their encoder tensors to every model forward.
    media = (MEDIA_COLUMN,) if cfg.data.multimodal_keys else ()
    actor_reads = ["tokens", "response_lengths", "loss_masks", "rollout_log_probs", "rewards", "weight_versions",
                   *media]
    # Streaming readers key rows by their sample index; whole-step readers list the partition's keys.
    scorer_reads = ("tokens", "response_lengths") + media + (("sample_indices",) if fully_async else ())
    if needs_reference(cfg):
        actor_reads.append("ref_log_probs")
    if needs_teacher(cfg):
        actor_reads.append("teacher_log_probs")
    if critic and not fully_async:
        actor_reads.append("values")
    if fully_async:  # written by ActorFwd and Advantages
        actor_reads += ["advantages"] + (["old_log_probs"] if needs_actor_fwd(cfg) else [])
    debug_train = cfg.debug.debug_train_only
    roles.append(RolePlan("actor", 0 if cfg.debug.debug_rollout_only else _ranks(cfg, "actor"), "rank",
                          reads=tuple(dict.fromkeys(actor_reads)),
                          writes=("returns",) if critic and not fully_async else (), checkpoints=True))
    external = cfg.rollout.rollout_external  # engines already running: none launched, no GPUs reserved
    tp = cfg.cluster.rollout_num_gpus_per_engine if device == "gpu" and not external else 1
    if tp > 1 and cfg.cluster.rollout_backend == "hf":
        raise PlanError(f"--rollout-num-gpus-per-engine {tp}: an hf engine runs on one GPU (tensor parallelism is "
                        "SGLang's); use --rollout-backend sglang or 1 GPU per engine")
    engines = len(cfg.rollout.rollout_external_engine_addrs or ()) if external else rollout_engines(cfg, tp)
    unit = "" if debug_train else "external engine" if external else "engine"
    roles.append(RolePlan("rollout", 0 if debug_train else engines, unit, gpus_each=tp,
                          writes=ROLLOUT_COLUMNS + media, streams=fully_async, receives_weights=not debug_train,
                          checkpoints=True, reward_workers=cfg.reward.reward_num_workers))
    if needs_reference(cfg):
        roles.append(RolePlan("reference", _ranks(cfg, "reference"), "rank", writes=("ref_log_probs",),
                              reads=scorer_reads, scores=not fully_async, streams=fully_async))
    if needs_teacher(cfg):  # --opd-type sglang: engines (none for an external one at --rm-url); megatron: ranks
        engine = cfg.algo.opd_type == "sglang"
        launched = not engine or bool(cfg.algo.opd_teacher_load)
        roles.append(RolePlan("teacher", _ranks(cfg, "teacher") if launched else 0, "engine" if engine else "rank",
                              writes=("teacher_log_probs",), reads=scorer_reads,
                              scores=not fully_async, streams=fully_async))
    if critic:
        roles.append(RolePlan("critic", _ranks(cfg, "critic"), "rank", writes=("values",),
                              reads=scorer_reads + ("loss_masks", "values", "returns"), scores=not fully_async,
                              streams=fully_async, trains_after_actor=True, checkpoints=True))
    if needs_actor_fwd(cfg):
        roles.append(RolePlan("actor_fwd", _ranks(cfg, "actor_fwd"), "rank", writes=("old_log_probs",),
                              reads=scorer_reads + ("weight_versions",), streams=True, receives_weights=True))
    if fully_async:
        roles.append(RolePlan("advantages", writes=("advantages",) + (("returns",) if critic else ()),
                              reads=advantage_inputs(cfg) + ("sample_indices",), streams=True))
    roles.append(RolePlan("dcs"))
    if cfg.logging.use_metrics_service:  # first: up before any role reports to it
        roles.insert(0, RolePlan("metrics"))
    placement = None
    if device == "gpu":
        asks = [GpuAsk(r.name, r.workers, r.gpus_each if r.unit == "engine" else 1, 1.0 if r.unit == "rank" else 0.0)
                for r in roles if r.unit in ("rank", "engine")]
        try:
            placement = place_gpus(asks, colocate=not fully_async, cluster_gpus=int(gpus))
        except PlacementError as exc:
            raise PlanError(str(exc)) from None
        roles = [dataclasses.replace(r, slots=placement.role_slots(r.name), gpu_fraction=placement.fraction)
                 if placement.role_slots(r.name) else r for r in roles]
    check_resource_roles(cfg, roles)

    computes = () if fully_async else (("old_log_probs",) if old_policy == "old_log_probs" else ()) + (
        ("advantages",) + (("returns",) if critic else ()))
    by_name = {r.name: r for r in roles}
    actor = ActorPlan(
        role=by_name["actor"], loader="streaming" if fully_async else "whole_step", reads=by_name["actor"].reads,
        computes=computes, writes=("returns",) if critic and not fully_async else (), old_policy=old_policy,
        clears=not critic, passes=cfg.cluster.num_iters_per_train_update, overlap_weight_push=fully_async,
        pause_mode="abort" if cfg.rollout.partial_rollout else "in_place", max_staleness=cfg.cluster.max_staleness)
    streamable = cfg.reward.custom_reward_post_process_path is None and \
        cfg.reward.custom_convert_samples_to_train_data_path is None
    rollout = RolloutPlan(role=by_name["rollout"], stream_groups=fully_async and streamable,
                          overlapping_steps=fully_async,
                          release_memory=releases_engine_memory(cfg) and not external,
                          eval_waits_for_version=fully_async,
                          max_staleness=cfg.cluster.max_staleness)
    return RunPlan(
        mode=mode, train_backend=cfg.cluster.train_backend, rollout_backend=cfg.cluster.rollout_backend,
        device=device, roles=tuple(roles), actor=actor, rollout=rollout, columns=_flows(cfg, roles),
        clearer="critic" if critic else "actor",
        weight_receivers=tuple(r.name for r in roles if r.receives_weights),
        data_plane_cpus=TQ_CONTROLLER_CPUS + TQ_STORAGE_CPUS * cfg.cluster.num_data_storage_units,
        placement=placement, offload_train=offload_train(cfg, device, placement),
        notes=tuple(ignored_flags(cfg, device)),
    )


def check_resource_roles(cfg: RelaxConfig, roles: list[RolePlan]) -> None:
    """Every `--resource` entry names a role this run deploys (an entry for a role the mode or
    the flags leave out would be silently unused)."""
    deployed = {r.name for r in roles}
    why = {"actor_fwd": "ActorFwd (old log-probs) runs only with --fully-async and without --use-rollout-logprobs",
           "advantages": "the Advantages role runs only with --fully-async",
           "reference": "the Reference runs only with --use-kl-loss or --kl-coef",
           "teacher": "the Teacher runs only with --use-opd (its ranks, or its engines with --opd-type sglang)",
           "critic": "the Critic runs only with --advantage-estimator ppo",
           "genrm": "GenRM engines are sized by --genrm-num-gpus / --genrm-num-gpus-per-engine"}
    for name in cfg.cluster.resource:
        if name == "genrm" or (name not in deployed and name in why):
            raise PlanError(f"--resource {name}: {why[name]}; drop the entry (or enable the role)")
    teacher = next((r for r in roles if r.name == "teacher"), None)
    if "teacher" in cfg.cluster.resource and teacher is not None and not teacher.workers:
        raise PlanError("--resource teacher: the OPD teacher is the external server at --rm-url, so Relax launches "
                        "no teacher engine; drop the entry (or launch it with --opd-teacher-load DIR)")


# ---- flags this run accepts without effect ---------------------------------------------------

def offload_train(cfg: RelaxConfig, device: str, placement: GpuPlacement | None) -> bool:
    """Colocate on GPUs: the training ranks move their state to the host while the engines
    generate, unless --no-offload-train (fully async never offloads: validated)."""
    c = cfg.cluster
    wanted = c.offload or (c.offload_train if c.offload_train is not None else not c.fully_async)
    return bool(wanted and device == "gpu" and placement is not None and placement.shared and not c.fully_async)


def releases_engine_memory(cfg: RelaxConfig) -> bool:
    """Colocate: engines release weights and KV cache while the trainer runs, unless --no-offload-rollout."""
    c = cfg.cluster
    return not c.fully_async and (c.offload or c.offload_rollout is not False)


def ignored_flags(cfg: RelaxConfig, device: str) -> list[str]:
    """A note for every flag set to a non-default value that this run accepts but does not act on,
    with the reason; the run logs them at start and `--dry-run` prints them. Flags that would be
    silently wrong are rejected instead (`PlanError`)."""
    c, notes = cfg.cluster, []
    if device == "cpu" and (c.offload or c.offload_train):
        notes.append("--offload/--offload-train: on CPU there is no device memory to free; the ranks keep their "
                     "state (engines still release theirs around training)")
    from relax.config.validate import ignored_flag_notes

    notes += ignored_flag_notes(cfg)
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


def local_gpus() -> int:
    """GPUs on this machine without importing torch (for --dry-run): the NVIDIA driver's list,
    limited by CUDA_VISIBLE_DEVICES."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    try:
        count = len(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        return 0
    if visible is not None:
        count = min(count, len([v for v in visible.split(",") if v.strip() and v.strip() != "-1"]))
    return count


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
              f"  {'total':<33}{plan.cpus:>9.1f}{plan.gpus:>6g}", "", "columns of partition train_{step}:",
              f"  {'column':<19}{'dtype':<9}{'shape':<7}{'written by':<12}read by"]
    for flow in plan.columns:
        col = COLUMNS[flow.name]
        consumers = ", ".join(flow.consumers) or "-"
        lines.append(f"  {col.name:<19}{col.dtype:<9}{col.shape:<7}{flow.producer:<12}{consumers}")
    a = plan.actor
    computed = ", ".join(a.computes) or "nothing (every column arrives from the other roles)"
    lines += ["", f"actor: {a.loader.replace('_', '-')} loader; computes {computed}; old policy = {a.old_policy}; "
                  f"{a.passes} pass(es) over each step",
              f"partition cleared by: {plan.clearer} (after training the step)",
              f"weights: actor rank 0 -> {', '.join(plan.weight_receivers) or 'nobody'} through the DCS coordinator"
              + (", overlapping the next step" if a.overlap_weight_push else ", after every step")]
    if plan.placement is not None:
        lines.append(f"GPUs: {describe_placement(plan.placement)}"
                     + ("; training ranks offload to the host during rollout" if plan.offload_train else ""))
    if plan.mode == "fully_async":
        lines.append(f"staleness: rollout runs at most {a.max_staleness} weight version(s) ahead of training")
    if cfg is not None:
        lines.append(f"outputs: {cfg.misc.exp_dir}")
    lines += [f"note: {n}" for n in plan.notes]
    return "\n".join(lines)


def _part(plan: RunPlan, r: RolePlan) -> str:
    if r.name == "dcs":
        return "weight-sync coordinator (receivers, versions)"
    if r.name == "metrics":
        return "metrics service: every role's reports -> the metrics sinks"
    if r.name == "genrm":
        return "judge engines behind a router (rm-type genrm)"
    if r.name == "actor":
        return "trains each step, pushes weights" if r.workers else "consumes steps untrained (--debug-rollout-only)"
    verbs = []
    if r.name == "rollout":
        verbs.append("generates and scores samples" + (", streams them" if r.streams else ""))
    elif r.streams:
        verbs.append(f"streams {', '.join(r.writes)} onto rows as they arrive")
    elif r.scores:
        verbs.append(f"writes {', '.join(r.writes)} after the rollout")
    if r.trains_after_actor:
        verbs.append("trains after the actor")
    return "; ".join(verbs)


def plan_summary(plan: RunPlan) -> dict[str, Any]:
    """The plan as plain data (for logs and tests)."""
    return dataclasses.asdict(plan)
