"""Which training and inference backends run, and what each one needs of the flags.

`--train-backend` / `--rollout-backend auto` resolve once, here, to the first backend in order
of preference that this machine can run and this run fits (logged with why the ones before it
cannot); an explicit choice that cannot run here fails with what is missing. Then each
backend's own flags: every `--sglang-*` option through the inference backend's option check,
the Megatron flags (`relax.config.checks.megatron`), what the fsdp backend does not have, and
`--true-on-policy-mode`'s matching numerics.

Config imports no backend: the inference backends' option checks are handed in as a callable
(`EngineCheck`; the entrypoint passes `relax.backends.registry.check_engine_options`). Without
one the `--sglang-*` options are left to the engines to judge when they start.
"""

from __future__ import annotations

import logging
import os
from typing import Callable

from relax.config import machine
from relax.config.checks.inputs import hf_config
from relax.config.checks.megatron import check_megatron, check_model_flags, megatron_unfit
from relax.config.errors import ConfigError
from relax.config.schema import RelaxConfig

logger = logging.getLogger(__name__)


# (rollout backend, config) -> None: checks the engines' options as that backend will launch them.
# Raises ValueError naming the flag when an option is wrong, ImportError when the backend's own
# option parser does not import here.
EngineCheck = Callable[[str, RelaxConfig], None]


# Backends this build implements; `auto` picks the first available in order.
IMPLEMENTED_TRAIN_BACKENDS = ("fsdp", "megatron")
IMPLEMENTED_ROLLOUT_BACKENDS = ("hf", "sglang")
NEEDS_MET = {"sglang": "sglang is installed and a GPU is visible",
             "megatron": "megatron-core is installed and a GPU is visible"}  # what `auto` logs when it picks one


def backend_needs(backend: str, where: machine.Target | None = None) -> list[str]:
    """What `backend` needs that the target (this machine, or the `--cluster` described) lacks (empty:
    it can run there). megatron runs on a CPU too (gloo, float32) when chosen explicitly; `auto` picks
    it only with a GPU."""
    where = where or machine.target()
    if backend == "megatron":
        if not where.megatron:
            return ["megatron-core is not installed: pip install 'relax-rl[megatron]'"]
        return []
    if backend != "sglang":
        return []
    missing = []
    if not where.sglang:
        missing.append("sglang is not installed: pip install 'sglang[all]' in the environment the run starts from")
    if where.described and where.gpus == 0:
        missing.append("--cluster has no GPU (gpus_per_node 0): SGLang needs one; use --rollout-backend hf on CPU")
    elif not where.described and where.gpus == 0:
        gpus = machine.NVIDIA_GPUS
        listed = len(os.listdir(gpus)) if os.path.isdir(gpus) else 0
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>")
        driver = f"{gpus} lists {listed}" if listed else f"{gpus} empty"
        missing.append(f"no NVIDIA GPU is visible (CUDA_VISIBLE_DEVICES={visible}, {driver}): SGLang needs one; "
                       "use --rollout-backend hf on CPU")
    return missing


def resolve_backend(requested: str, preference: tuple[str, ...], implemented: tuple[str, ...], flag: str,
                    unfit: dict[str, list[str]] | None = None, where: machine.Target | None = None) -> str:
    """`auto` -> the first implemented backend in `preference` order that can run on the target (this
    machine or the `--cluster` described), logged with why the ones before it cannot; an explicit choice
    that is not built or cannot run there fails."""
    where = where or machine.target()
    if requested == "auto":
        skipped: dict[str, str] = {}
        for backend in preference:
            missing = ["not built in this build"] if backend not in implemented else backend_needs(backend, where)
            if backend == "megatron" and not missing and where.gpus == 0:
                missing = ["no GPU is visible (--train-backend megatron runs on CPU when asked for explicitly)"]
            missing = missing or (unfit or {}).get(backend, [])  # this run needs what the backend does not build
            if not missing:
                why = "; ".join(f"{b}: {reason}" for b, reason in skipped.items()) or NEEDS_MET.get(backend, "")
                logger.info("%s auto -> %s%s", flag, backend, f" ({why})" if why else "")
                return backend
            skipped[backend] = ", ".join(missing)
        reasons = "; ".join(f"{b}: {reason}" for b, reason in skipped.items())
        raise ConfigError(f"{flag} auto: no backend can run here ({reasons})")
    if requested not in implemented:
        raise ConfigError(f"{flag} {requested}: this build implements {', '.join(implemented)}; "
                          f"use {flag} auto or {implemented[0]}")
    missing = backend_needs(requested, where)
    if missing:
        raise ConfigError(f"{flag} {requested} cannot run here: {'; '.join(missing)}")
    return requested


def engine_options_checked(cfg: RelaxConfig, rollout: str, engine_check: EngineCheck | None) -> str:
    """The rollout backend once its engines' options passed `engine_check`: `rollout`, or hf when
    `auto` picked a backend whose option parser does not import here (installed, with a GPU). For a
    `--cluster` plan a parser that does not import here leaves the options to the cluster (logged)."""
    if engine_check is None or rollout == "hf":
        return rollout
    try:
        engine_check(rollout, cfg)
    except ImportError as exc:  # installed, with a GPU, but its parser does not import: say so (auto: use hf)
        if cfg.cluster.cluster is not None:
            logger.info("--cluster: the --sglang-* options are not checked here (%s); the engines check them "
                        "on the cluster", exc)
            return rollout
        if cfg.cluster.rollout_backend != "auto":
            raise ConfigError(f"--rollout-backend {rollout} cannot run here: {exc}") from exc
        logger.info("--rollout-backend auto -> hf (%s: %s)", rollout, exc)
        return "hf"
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    return rollout


def check_backends(cfg: RelaxConfig, engine_check: EngineCheck | None = None) -> RelaxConfig:
    """Both backends resolved (`auto` -> a name), then the flags each one reads."""
    c = cfg.cluster
    where = machine.target(c.cluster)  # this machine, or the cluster --cluster describes
    train = resolve_backend(c.train_backend, ("megatron", "fsdp"), IMPLEMENTED_TRAIN_BACKENDS, "--train-backend",
                            unfit={"megatron": megatron_unfit(cfg)}, where=where)
    # --true-on-policy-mode is built for the hf engine (check_true_on_policy refused an explicit sglang).
    preference = ("hf",) if c.true_on_policy_mode else ("sglang", "hf")
    rollout = resolve_backend(c.rollout_backend, preference, IMPLEMENTED_ROLLOUT_BACKENDS, "--rollout-backend",
                              where=where)
    rollout = engine_options_checked(cfg, rollout, engine_check)
    cfg = cfg.replace(train_backend=train, rollout_backend=rollout)
    hf = hf_config(cfg.ckpt.hf_checkpoint)
    if cfg.cluster.train_backend == "megatron":
        check_megatron(cfg, hf)
    if cfg.cluster.train_backend == "fsdp":
        check_fsdp(cfg)
    check_model_flags(cfg, hf)
    check_update_interval(cfg)
    return cfg


def check_update_interval(cfg: RelaxConfig) -> None:
    """--update-weights-interval N >= 1; with N > 1 the engines keep their weights between pushes,
    which SGLang's colocate memory release does not (it frees them and expects a push after)."""
    n = cfg.rollout.update_weights_interval
    if n < 1:
        raise ConfigError(f"--update-weights-interval must be >= 1 (push every N steps), got {n}")
    if n > 1 and cfg.cluster.rollout_backend == "sglang" and not cfg.cluster.fully_async and \
            cfg.cluster.offload_rollout is not False:
        raise ConfigError(f"--update-weights-interval {n}: SGLang engines free their weights while the trainer runs "
                          "(colocate offload) and need a push after every step; add --no-offload-rollout to keep "
                          "them between pushes")


def check_fsdp(cfg: RelaxConfig) -> None:
    """--train-backend fsdp: no Megatron flag it would not read, and recomputation it has."""
    if cfg.megatron.custom_model_provider_path:
        raise ConfigError("--custom-model-provider-path builds a megatron-core model; the fsdp backend trains the HF "
                          "model: add --train-backend megatron, or drop the flag")
    if cfg.parallel.recompute_granularity == "selective":
        raise ConfigError("--recompute-granularity selective recomputes Megatron's attention core, which the fsdp "
                          "backend does not have; use --recompute-granularity full (per-layer checkpointing)")
    if cfg.parallel.recompute_granularity is None and (cfg.parallel.recompute_method or
                                                       cfg.parallel.recompute_num_layers is not None):
        raise ConfigError("--recompute-method / --recompute-num-layers need --recompute-granularity full")


def check_true_on_policy(cfg: RelaxConfig) -> None:
    """--true-on-policy-mode needs the same numerics on both sides (docs/true-on-policy.md).

    Independent of --max-staleness: it removes the numerics gap between engine and trainer;
    staleness adds a policy lag on top, which the mismatch metrics then show on purpose.
    Runs before backend resolution so an explicit megatron/sglang gets this message;
    `auto` resolves to fsdp/hf in this build."""
    c = cfg.cluster
    if not c.true_on_policy_mode:
        return
    if c.train_backend == "megatron" or c.rollout_backend == "sglang":
        raise ConfigError(
            "--true-on-policy-mode is implemented for --train-backend fsdp with --rollout-backend hf. With sglang/"
            "megatron it needs batch-invariant deterministic kernels on both sides with identical attention and "
            "reductions (SGLang: --sglang-enable-deterministic-inference --sglang-rl-on-policy-target fsdp "
            "--sglang-attention-backend fa3; trainer: deterministic mode with the matching attention kernel; env "
            "NCCL_ALGO=allreduce:tree, CUBLAS_WORKSPACE_CONFIG=:4096:8), which this build does not wire; "
            "use --train-backend fsdp --rollout-backend hf or drop --true-on-policy-mode")
    if cfg.optim.bf16:
        raise ConfigError("--true-on-policy-mode compares float32 numerics (the engine is launched in float32 like "
                          "the fsdp trainer); drop --bf16")
    if c.engine_threads < 1:
        raise ConfigError("--true-on-policy-mode needs the same torch thread count in engines and trainers (float "
                          "reductions may split by thread); set --engine-threads N >= 1, got "
                          f"{c.engine_threads}")
    fwd_threads = (c.ref_actor_config or {}).get("threads")
    if fwd_threads is not None and fwd_threads != c.engine_threads:
        raise ConfigError(f"--true-on-policy-mode: --ref-actor-config threads={fwd_threads} differs from "
                          f"--engine-threads {c.engine_threads}; the old-policy/reference log-probs must use the "
                          "engines' thread count: drop the override or make them equal")
