"""Cross-flag validation and derived defaults, run before Ray starts.

Each check raises `ConfigError` naming the flags involved and the fix. The config is frozen:
a check that derives a value (the mode, the default --resource, the global batch size, the
resolved backends) returns a new config, so derived values are filled in here once and no
other module re-derives them. `validate_config(cfg)` returns the final config.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import logging
import os
import time
from pathlib import Path

from relax.config import plan
from relax.config.eval_config import eval_datasets
from relax.config.fault import check_fault_flags
from relax.config.fields import field_default, flag_for
from relax.config.megatron_checks import check_model_flags, check_megatron, megatron_unfit
from relax.config.parser import ConfigError
from relax.config.schema import FIELD_GROUP, GENRM_SAMPLING_DEFAULTS, GROUPS, MEGATRON_ONLY, RelaxConfig

logger = logging.getLogger(__name__)

KNOWN_ROLES = ("actor", "rollout", "reference", "actor_fwd", "advantages", "critic", "teacher", "genrm")

# Numeric flags and the range a value must lie in: (low, high, what it means), bounds inclusive
# unless marked open by a tuple `(bound, "open")`; None: unbounded. Unset (None) values pass.
RANGES: dict[str, tuple[object, object, str]] = {
    "lr": ((0, "open"), None, "a learning rate"), "min_lr": (0, None, "a learning rate"),
    "critic_lr": ((0, "open"), None, "a learning rate"), "weight_decay": (0, None, "a decay factor"),
    "adam_beta1": (0, (1, "open"), "a moment decay"), "adam_beta2": (0, (1, "open"), "a moment decay"),
    "adam_eps": ((0, "open"), None, "a denominator epsilon"), "clip_grad": (0, None, "a gradient norm (0 = off)"),
    "lr_warmup_iters": (0, None, "a step count"), "lr_decay_iters": (1, None, "a step count"),
    "eps_clip": ((0, "open"), None, "a ratio clip"), "eps_clip_high": ((0, "open"), None, "a ratio clip"),
    "kl_coef": (0, None, "a coefficient"), "kl_loss_coef": (0, None, "a coefficient"),
    "gamma": (0, 1, "a discount"), "lambd": (0, 1, "a GAE lambda"), "tis_clip": ((0, "open"), None, "a clip"),
    "tis_clip_low": (0, None, "a clip"), "rollout_temperature": (0, None, "a temperature"),
    "eval_temperature": (0, None, "a temperature"), "rollout_top_p": ((0, "open"), 1, "a probability mass"),
    "eval_top_p": ((0, "open"), 1, "a probability mass"), "num_rollout": (1, None, "a step count"),
    "num_epoch": (1, None, "an epoch count"), "rollout_batch_size": (1, None, "a prompt count"),
    "global_batch_size": (1, None, "a sample count"), "rollout_max_response_len": (1, None, "a token count"),
    "eval_max_response_len": (1, None, "a token count"), "save_interval": (1, None, "a step interval"),
    "eval_interval": (1, None, "a step interval"), "max_actor_ckpt_to_keep": (1, None, "a checkpoint count"),
    "n_samples_per_eval_prompt": (1, None, "a sample count"), "reward_timeout": ((0, "open"), None, "seconds"),
    "http_timeout": ((0, "open"), None, "seconds"), "weight_sync_timeout": ((0, "open"), None, "seconds"),
    "engine_startup_timeout": ((0, "open"), None, "seconds"), "update_weight_buffer_size": (1, None, "bytes"),
    "reward_num_workers": (1, None, "a process count"), "reward_max_concurrency": (1, None, "a call count"),
    "engine_threads": (0, None, "a thread count, 0 = split the cores"),
    "num_data_storage_units": (1, None, "a unit count"),
    "distributed_timeout_minutes": (1, None, "minutes"),
}


def _bound(bound: object) -> tuple[float | None, bool]:
    return (bound[0], True) if isinstance(bound, tuple) else (bound, False)  # (value, open)


def check_ranges(cfg: RelaxConfig) -> None:
    """Every numeric flag of RANGES lies in its range (a negative --lr fails here, not mid-run)."""
    for name, (low, high, meaning) in RANGES.items():
        value = getattr(getattr(cfg, FIELD_GROUP[name]), name)
        if value is None:
            continue
        (lo, lo_open), (hi, hi_open) = _bound(low), _bound(high)
        too_low = lo is not None and (value <= lo if lo_open else value < lo)
        too_high = hi is not None and (value >= hi if hi_open else value > hi)
        if too_low or too_high:
            lower = "" if lo is None else f"{'>' if lo_open else '>='} {lo}"
            upper = "" if hi is None else f"{'<' if hi_open else '<='} {hi}"
            allowed = " and ".join(x for x in (lower, upper) if x)
            raise ConfigError(f"{flag_for(name)} must be {allowed} ({meaning}), got {value}")


def check_unsupported(cfg: RelaxConfig) -> None:
    for group_name, cls in GROUPS.items():
        group = getattr(cfg, group_name)
        for f in dataclasses.fields(cls):
            if f.metadata.get("supported", True):
                continue
            if getattr(group, f.name) != field_default(f):
                raise ConfigError(
                    f"{flag_for(f.name)} is accepted for compatibility with Relax/slime scripts but is not implemented "
                    f"in this build yet; remove it (see docs/configuration.md for what each flag does here)"
                )


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
    elif c.max_staleness:
        raise ConfigError(f"--max-staleness {c.max_staleness} bounds how far rollout runs ahead of training, "
                          "which only happens with --fully-async (colocate is always on-policy); "
                          "add --fully-async or drop it")
    return cfg.replace(colocate=not c.fully_async)


def check_fully_async(cfg: RelaxConfig) -> None:
    """What the fully-async pipeline does not combine with (yet), each with its way out."""
    d, c = cfg.debug, cfg.cluster
    if d.debug_train_only or d.load_debug_rollout_data or d.debug_rollout_only:
        raise ConfigError("--fully-async runs rollout and training concurrently; the debug modes (--debug-train-only, "
                          "--load-debug-rollout-data, --debug-rollout-only) run in colocate mode: drop --fully-async")
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
    res = dict(c.resource or {"actor": [1, 1]})
    given = res.setdefault("rollout", [1, len(addrs)])
    if not isinstance(given, list) or len(given) != 2 or given[1] != len(addrs):
        raise ConfigError(f"--resource rollout {given} disagrees with the {len(addrs)} address(es) of "
                          "--rollout-external-engine-addrs: with --rollout-external the addresses are the engines "
                          f"(Relax launches none and reserves no GPUs for them); set \"rollout\": [1, {len(addrs)}] "
                          "or drop the rollout entry")
    return cfg.replace(resource=res)


def check_resource(cfg: RelaxConfig) -> RelaxConfig:
    res = cfg.cluster.resource
    if res is None:
        cfg = cfg.replace(resource={"actor": [1, 1], "rollout": [1, 1]})
        res = cfg.cluster.resource
    if not isinstance(res, dict):
        example = '{"actor": [1, 2], "rollout": [1, 2]}'
        raise ConfigError(f"--resource must be a JSON object like '{example}', got {res!r}")
    for role, spec in res.items():
        if role not in KNOWN_ROLES:
            raise ConfigError(f"--resource: unknown role {role!r}; known roles: {', '.join(KNOWN_ROLES)}")
        if not (isinstance(spec, list) and len(spec) == 2 and all(isinstance(x, int) and x >= 0 for x in spec)):
            raise ConfigError(f"--resource {role}: expected [replicas, gpus] as two non-negative integers, "
                              f"got {spec!r}")
    for role in ("actor", "rollout"):
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
    for role in ("actor", "critic"):
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
    if not r.rollout_max_response_len or r.rollout_max_response_len < 1:
        raise ConfigError("--rollout-max-response-len is required (max new tokens per response)")
    return cfg


def check_algorithm(cfg: RelaxConfig) -> None:
    a = cfg.algo
    if a.kl_coef != 0 and a.kl_loss_coef != 0:
        raise ConfigError("--kl-coef (reward shaping) and --kl-loss-coef (loss) cannot both be non-zero; pick one")
    if a.kl_loss_coef != 0 and not a.use_kl_loss:
        raise ConfigError("--kl-loss-coef is set but --use-kl-loss is not; add --use-kl-loss or drop the coefficient")
    if (a.loss_type == "custom_loss") != bool(a.custom_loss_function_path):
        raise ConfigError("--loss-type custom_loss and --custom-loss-function-path go together: set both or neither")
    if a.custom_tis_function_path and not a.use_tis:
        raise ConfigError("--custom-tis-function-path needs --use-tis (it replaces the TIS weights)")
    if a.eps_clip_c is not None and a.eps_clip_c <= 1.0:
        raise ConfigError(f"--eps-clip-c must be > 1 (dual-clip lower bound), got {a.eps_clip_c}")
    if (a.use_kl_loss or a.kl_coef) and not (cfg.ckpt.ref_load or cfg.ckpt.hf_checkpoint):
        raise ConfigError("--use-kl-loss / --kl-coef need a reference model: set --ref-load (or --hf-checkpoint)")
    if a.ref_update_interval is not None:
        if a.ref_update_interval < 1:
            raise ConfigError(f"--ref-update-interval must be >= 1 (rollout steps), got {a.ref_update_interval}")
        if not (a.use_kl_loss or a.kl_coef):
            raise ConfigError("--ref-update-interval refreshes the reference model, which only runs with "
                              "--use-kl-loss or --kl-coef; add one of them or drop --ref-update-interval")
    check_critic(cfg)
    check_opd(cfg)


# Critic flags, which only mean something when a critic is deployed (--advantage-estimator ppo).
CRITIC_FLAGS = ("num_critic_only_steps", "critic_train_only", "critic_lr", "critic_lr_warmup_iters")


def check_critic(cfg: RelaxConfig) -> None:
    a, defaults = cfg.algo, type(cfg.algo)()
    if a.advantage_estimator != "ppo":
        set_flags = [flag_for(n) for n in CRITIC_FLAGS if getattr(a, n) != getattr(defaults, n)]
        set_flags += [flag_for(n) for n in ("critic_load", "critic_save") if getattr(cfg.ckpt, n)]
        if set_flags or "critic" in (cfg.cluster.resource or {}):
            raise ConfigError(f"{', '.join(set_flags) or '--resource critic'} configure the critic, which only "
                              "--advantage-estimator ppo deploys; add it or drop these flags")
        return
    if a.num_critic_only_steps < 0 or a.critic_lr_warmup_iters < 0:
        raise ConfigError("--num-critic-only-steps and --critic-lr-warmup-iters must be >= 0")
    if a.critic_lr is not None and a.critic_lr <= 0:
        raise ConfigError(f"--critic-lr must be > 0, got {a.critic_lr}")
    if cfg.ckpt.critic_save and not cfg.ckpt.save:
        raise ConfigError("--critic-save: critic checkpoints are written with the actor's; add --save DIR (and "
                          "--save-interval N)")
    if a.value_clip <= 0:
        raise ConfigError(f"--value-clip must be > 0 (the clip range of the value update), got {a.value_clip}")


def check_ref_actor_config(cfg: RelaxConfig) -> None:
    """--ref-actor-config: the keys the Reference/ActorFwd services read (threads); others would be
    silently ignored."""
    overrides = cfg.cluster.ref_actor_config or {}
    if not isinstance(overrides, dict):
        raise ConfigError(f"--ref-actor-config must be a JSON object like '{{\"threads\": 2}}', got {overrides!r}")
    unknown = sorted(set(overrides) - {"threads"})
    if unknown:
        raise ConfigError(f"--ref-actor-config: unknown key(s) {unknown}; it takes {{\"threads\": N}} (the Reference "
                          "and ActorFwd use the actor's parallel layout and flags otherwise)")
    threads = overrides.get("threads")
    if threads is not None and (not isinstance(threads, int) or isinstance(threads, bool) or threads < 1):
        raise ConfigError(f"--ref-actor-config threads must be an integer >= 1, got {threads!r}")


def check_multimodal(cfg: RelaxConfig) -> None:
    """--multimodal-keys: the parts that take media (rollout, hf/SGLang engines, fsdp actor and
    reference) are built; a critic or an OPD teacher would score rows without their images."""
    pool = cfg.data.mm_processor_pool_size
    if pool < 0 or pool and not cfg.data.multimodal_keys:
        raise ConfigError(f"--mm-processor-pool-size {pool}: it sets the processes that encode multimodal prompts, "
                          "so it must be >= 0 and needs --multimodal-keys")
    if cfg.data.use_audio_in_video and "video" not in (cfg.data.multimodal_keys or {}):
        raise ConfigError("--use-audio-in-video needs videos: name their column in --multimodal-keys "
                          "('{\"video\": \"<column>\"}') and use an Omni model")
    if not cfg.data.multimodal_keys:
        return
    if cfg.algo.advantage_estimator == "ppo":
        raise ConfigError("--multimodal-keys with --advantage-estimator ppo: the critic does not take images in this "
                          "build; use a critic-free estimator (grpo, gspo, reinforce_plus_plus, ...)")
    if cfg.algo.use_opd:
        raise ConfigError("--multimodal-keys with --use-opd: the OPD teacher does not take images in this build")


def check_opd(cfg: RelaxConfig) -> None:
    a = cfg.algo
    if a.advantage_estimator == "on_policy_distillation" and not a.use_opd:
        raise ConfigError("--advantage-estimator on_policy_distillation needs --use-opd --opd-type sglang|megatron "
                          "(OPD now works with any estimator: add --use-opd to grpo, ppo, ...)")
    if not a.use_opd:
        if a.opd_type or a.opd_teacher_load:
            raise ConfigError("--opd-type / --opd-teacher-load need --use-opd; add it or drop them")
        return
    if a.opd_type is None:
        raise ConfigError("--use-opd needs --opd-type: sglang (teacher on an inference engine) or megatron "
                          "(teacher in the training backend)")
    if a.opd_kl_coef <= 0:
        raise ConfigError(f"--opd-kl-coef must be > 0 with --use-opd (it weighs the teacher KL), got {a.opd_kl_coef}")
    if a.opd_type == "megatron" and not a.opd_teacher_load:
        raise ConfigError("--opd-type megatron loads the teacher in the training backend: set --opd-teacher-load DIR")
    if a.opd_type == "sglang" and not (a.opd_teacher_load or cfg.reward.rm_url):
        raise ConfigError("--opd-type sglang needs a teacher engine: --opd-teacher-load DIR (Relax launches one) or "
                          "--rm-url http://HOST:PORT/generate (an external SGLang server)")
    if a.opd_type == "sglang" and not a.opd_teacher_load and cfg.reward.rm_type == "remote_rm":
        raise ConfigError("--rm-url is the reward service of --rm-type remote_rm, so it cannot also be the OPD "
                          "teacher: launch the teacher with --opd-teacher-load DIR instead")
    if a.opd_teacher_load and not (Path(a.opd_teacher_load) / "config.json").is_file():
        raise ConfigError(f"--opd-teacher-load {a.opd_teacher_load}: no config.json there; point it at an HF model "
                          "directory that uses the student's tokenizer")


def _hf_config(path: str) -> dict:
    cfg_file = Path(path) / "config.json"
    if not cfg_file.is_file():
        raise ConfigError(f"--hf-checkpoint {path}: no config.json there; point it at an HF model directory")
    return json.loads(cfg_file.read_text())


def check_paths(cfg: RelaxConfig) -> None:
    if not cfg.ckpt.hf_checkpoint:
        raise ConfigError("--hf-checkpoint is required (HF model directory: tokenizer, architecture, weights)")
    _hf_config(cfg.ckpt.hf_checkpoint)
    if cfg.ckpt.save_interval is not None and not cfg.ckpt.save:
        raise ConfigError("--save-interval needs --save (where to write checkpoints)")
    if cfg.data.prompt_data is None:
        raise ConfigError("--prompt-data is required (a .jsonl or .parquet file of prompts)")
    for path in _prompt_paths(cfg.data.prompt_data):
        if not os.path.exists(path):
            raise ConfigError(f"--prompt-data: file not found: {path}")


def check_eval(cfg: RelaxConfig) -> None:
    """The eval sets resolve (an --eval-config file is read and its keys checked) and their files exist."""
    try:
        datasets = eval_datasets(cfg.args)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    source = "--eval-config" if cfg.eval.eval_config else "--eval-prompt-data"
    for dataset in datasets:
        if not os.path.exists(dataset.path.split("@[")[0]):
            raise ConfigError(f"{source} {dataset.name}: file not found: {dataset.path}")
        generate_path = dataset.custom_generate_function_path
        if generate_path and generate_path != cfg.rollout.custom_generate_function_path:
            _check_plugin(generate_path, f"{source} {dataset.name}: custom_generate_function_path", 3,
                          "generate(args, sample, sampling_params[, evaluation])")
    if cfg.eval.eval_config and cfg.eval.eval_prompt_data:
        logger.warning("--eval-config is set: it replaces --eval-prompt-data %s", cfg.eval.eval_prompt_data)


def check_context(cfg: RelaxConfig) -> None:
    """Context limits fit the model (max_position_embeddings) and leave room for a response."""
    limit = _hf_config(cfg.ckpt.hf_checkpoint).get("max_position_embeddings")
    for flag, value in (("--rollout-max-context-len", cfg.rollout.rollout_max_context_len),
                        ("--eval-max-context-len", cfg.eval.eval_max_context_len)):
        if value is None:
            continue
        if value < 2:
            raise ConfigError(f"{flag} must be >= 2 (prompt + at least one response token), got {value}")
        if limit is not None and value > int(limit):
            raise ConfigError(f"{flag} {value} exceeds the model's max_position_embeddings {limit} "
                              f"({cfg.ckpt.hf_checkpoint}/config.json); lower it")


def check_prefetch(cfg: RelaxConfig) -> None:
    d = cfg.data
    for flag, value, least in (("--prefetch-chunk-size", d.prefetch_chunk_size, 1),
                               ("--prefetch-num-workers", d.prefetch_num_workers, 1),
                               ("--prefetch-max-cached", d.prefetch_max_cached, 0)):
        if value < least:
            raise ConfigError(f"{flag} must be >= {least}, got {value}"
                              + (" (0 disables prefetching)" if flag == "--prefetch-max-cached" else ""))


def check_genrm(cfg: RelaxConfig) -> None:
    r = cfg.reward
    if r.rm_type == "genrm" and not r.genrm_model_path:
        raise ConfigError("--rm-type genrm needs a judge model: set --genrm-model-path PATH (an HF model directory)")
    if not r.genrm_model_path:
        return
    if not (Path(r.genrm_model_path) / "config.json").is_file():
        raise ConfigError(f"--genrm-model-path {r.genrm_model_path}: no config.json there; point it at an HF model "
                          "directory")
    if r.genrm_num_gpus_per_engine < 1 or r.genrm_num_gpus < r.genrm_num_gpus_per_engine or \
            r.genrm_num_gpus % r.genrm_num_gpus_per_engine:
        raise ConfigError(f"--genrm-num-gpus {r.genrm_num_gpus} must be a positive multiple of "
                          f"--genrm-num-gpus-per-engine {r.genrm_num_gpus_per_engine} (engines = their quotient)")
    for flag, value in (("--genrm-engine-config", r.genrm_engine_config),
                        ("--genrm-sampling-config", r.genrm_sampling_config)):
        if value is not None and not isinstance(value, dict):
            raise ConfigError(f"{flag} must be a JSON object, got {value!r}")
    unknown = sorted(set(r.genrm_sampling_config or {}) - set(GENRM_SAMPLING_DEFAULTS))
    if unknown:
        raise ConfigError(f"--genrm-sampling-config: unknown key(s) {unknown}; known keys: "
                          f"{', '.join(GENRM_SAMPLING_DEFAULTS)}")


def _prompt_paths(value: object) -> list[str]:
    if isinstance(value, list):
        return [str(v) for v in value]
    text = str(value).strip()
    if text.startswith("["):
        try:
            return [str(v) for v in json.loads(text.replace("'", '"'))]
        except json.JSONDecodeError as exc:
            raise ConfigError(f"--prompt-data {text!r}: not a valid list of paths ({exc.msg})") from exc
    return [text]


# Backends this build implements; `auto` picks the first available in order.
IMPLEMENTED_TRAIN_BACKENDS = ("fsdp", "megatron")
IMPLEMENTED_ROLLOUT_BACKENDS = ("hf", "sglang")
# The sglang backend's argument module, loaded by name (config imports no backend): it renders the
# engines' argv and checks it with SGLang's own parser, in a child process.
SGLANG_ARGS = "relax.backends.sglang.args"


def sglang_installed() -> bool:
    """The sglang package is on this Python's path (found, not imported: importing it costs seconds)."""
    return importlib.util.find_spec("sglang") is not None


NVIDIA_GPUS = "/proc/driver/nvidia/gpus"  # the driver's list of GPUs (what `plan.local_gpus` reads)
NEEDS_MET = {"sglang": "sglang is installed and a GPU is visible",
             "megatron": "megatron-core is installed and a GPU is visible"}  # what `auto` logs when it picks one


def backend_needs(backend: str) -> list[str]:
    """What `backend` needs that this machine lacks (empty: it can run here). megatron runs on a CPU
    too (gloo, float32) when chosen explicitly; `auto` picks it only with a GPU."""
    if backend == "megatron":
        if importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.core") is None:
            return ["megatron-core is not installed: pip install 'relax-rl[megatron]'"]
        return []
    if backend != "sglang":
        return []
    missing = []
    if not sglang_installed():
        missing.append("sglang is not installed: pip install 'sglang[all]' in the environment the run starts from")
    if plan.local_gpus() == 0:
        listed = len(os.listdir(NVIDIA_GPUS)) if os.path.isdir(NVIDIA_GPUS) else 0
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>")
        driver = f"{NVIDIA_GPUS} lists {listed}" if listed else f"{NVIDIA_GPUS} empty"
        missing.append(f"no NVIDIA GPU is visible (CUDA_VISIBLE_DEVICES={visible}, {driver}): SGLang needs one; "
                       "use --rollout-backend hf on CPU")
    return missing


def resolve_backend(requested: str, preference: tuple[str, ...], implemented: tuple[str, ...], flag: str,
                    unfit: dict[str, list[str]] | None = None) -> str:
    """`auto` -> the first implemented backend in `preference` order that can run here, logged with
    why the ones before it cannot; an explicit choice that is not built or cannot run here fails."""
    if requested == "auto":
        skipped: dict[str, str] = {}
        for backend in preference:
            missing = ["not built in this build"] if backend not in implemented else backend_needs(backend)
            if backend == "megatron" and not missing and plan.local_gpus() == 0:
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
    missing = backend_needs(requested)
    if missing:
        raise ConfigError(f"{flag} {requested} cannot run here: {'; '.join(missing)}")
    return requested


def check_sglang_options(cfg: RelaxConfig) -> None:
    """Every `--sglang-*` option as the engines will get it, through SGLang's own parser. Raises
    ConfigError naming the flag; ImportError when SGLang's parser does not import here."""
    from relax.utils.plugins import import_object

    args = import_object(SGLANG_ARGS, flag="--rollout-backend sglang")
    tp = cfg.cluster.rollout_num_gpus_per_engine
    try:
        options = args.normalize_options(cfg.sglang)
        if options.get("tp_size") is not None and str(options["tp_size"]).strip() != str(tp):
            raise ValueError(f"--sglang-tp-size {options['tp_size']} contradicts --rollout-num-gpus-per-engine {tp}: "
                             "an engine runs tensor parallel over the GPUs it is given; drop --sglang-tp-size")
        argv = args.server_argv(cfg.ckpt.hf_checkpoint or "model", "127.0.0.1", 30000, {**options, "tp_size": tp})
        args.validate_server_argv(argv)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc


def check_backends(cfg: RelaxConfig) -> RelaxConfig:
    c = cfg.cluster
    train = resolve_backend(c.train_backend, ("megatron", "fsdp"), IMPLEMENTED_TRAIN_BACKENDS, "--train-backend",
                            unfit={"megatron": megatron_unfit(cfg)})
    # --true-on-policy-mode is built for the hf engine (check_true_on_policy refused an explicit sglang).
    preference = ("hf",) if c.true_on_policy_mode else ("sglang", "hf")
    rollout = resolve_backend(c.rollout_backend, preference, IMPLEMENTED_ROLLOUT_BACKENDS, "--rollout-backend")
    if rollout == "sglang":
        try:
            check_sglang_options(cfg)
        except ImportError as exc:  # installed, with a GPU, but its parser does not import: say so (auto: use hf)
            if c.rollout_backend != "auto":
                raise ConfigError(f"--rollout-backend sglang cannot run here: {exc}") from exc
            logger.info("--rollout-backend auto -> hf (sglang: %s)", exc)
            rollout = "hf"
    cfg = cfg.replace(train_backend=train, rollout_backend=rollout)
    hf = _hf_config(cfg.ckpt.hf_checkpoint)
    if cfg.cluster.train_backend == "megatron":
        check_megatron(cfg, hf)
    if cfg.cluster.train_backend == "fsdp":
        if cfg.megatron_extra:
            raise ConfigError(f"unknown flag(s) {' '.join(cfg.megatron_extra)}; if these are Megatron flags they only "
                              "apply with --train-backend megatron (the fsdp backend reads the HF config)")
        if cfg.parallel.recompute_granularity == "selective":
            raise ConfigError("--recompute-granularity selective recomputes Megatron's attention core, which the fsdp "
                              "backend does not have; use --recompute-granularity full (per-layer checkpointing)")
        if cfg.parallel.recompute_granularity is None and (cfg.parallel.recompute_method or
                                                           cfg.parallel.recompute_num_layers is not None):
            raise ConfigError("--recompute-method / --recompute-num-layers need --recompute-granularity full")
    check_model_flags(cfg, hf)
    return cfg


def ignored_flag_notes(cfg: RelaxConfig) -> list[str]:
    """One note per reason for the flags set to a non-default value that this build accepts
    without effect (`opt(ignored=...)`): the run logs them, `--dry-run` prints them."""
    by_reason: dict[str, list[str]] = {}
    for group_name, cls in GROUPS.items():
        group = getattr(cfg, group_name)
        for f in dataclasses.fields(cls):
            reason = f.metadata.get("ignored")
            if reason == MEGATRON_ONLY and cfg.cluster.train_backend == "megatron":
                continue  # check_megatron: each acts or is an error
            if reason and getattr(group, f.name) != field_default(f):
                by_reason.setdefault(reason, []).append(flag_for(f.name))
    return [f"{' '.join(flags)}: accepted and ignored: {reason}" for reason, flags in by_reason.items()]


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


def check_plugins(cfg: RelaxConfig) -> None:
    specs = [
        (cfg.reward.custom_rm_path, "--custom-rm-path", 2, "reward_func(args, sample, **kwargs)"),
        (cfg.rollout.custom_generate_function_path, "--custom-generate-function-path", 3,
         "generate(args, sample, sampling_params[, evaluation])"),
        (cfg.rollout.rollout_function_path, "--rollout-function-path", 3,
         "generate_rollout(args, rollout_id, data_source, evaluation=False)"),
        (cfg.data.custom_prompt_path, "--custom-prompt-path", 2, "fn(prompt, data)"),
        (cfg.eval.eval_function_path, "--eval-function-path", 3,
         "generate_rollout(args, rollout_id, data_source, evaluation=True)"),
        (cfg.reward.custom_reward_post_process_path, "--custom-reward-post-process-path", 2,
         "fn(args, samples) -> (raw_rewards, rewards)"),
        (cfg.algo.custom_loss_function_path, "--custom-loss-function-path", 2,
         "custom_loss(inputs: PolicyLossInputs, cfg: PolicyLossConfig)"),
        (cfg.rollout.dynamic_sampling_filter_path, "--dynamic-sampling-filter-path", 2,
         "filter(args, samples, **kwargs) -> bool | DynamicFilterOutput"),
        (cfg.reward.custom_convert_samples_to_train_data_path, "--custom-convert-samples-to-train-data-path", 2,
         "convert_samples_to_train_data(args, samples) -> dict"),
    ]
    for path, flag, positional, expected in specs:
        if path:
            _check_plugin(path, flag, positional, expected)


def _check_plugin(path: str, flag: str, positional: int, expected: str) -> None:
    from relax.utils.plugins import PluginError, load_plugin

    try:
        load_plugin(path, flag=flag, positional=positional, expected=expected)
    except PluginError as exc:
        raise ConfigError(str(exc)) from exc


def check_exp_dir(cfg: RelaxConfig) -> RelaxConfig:
    """The run directory as an absolute path (default ./outputs/<timestamp>); created when the run starts."""
    default = os.path.join("outputs", time.strftime("%Y%m%d-%H%M%S"))
    return cfg.replace(exp_dir=os.path.abspath(cfg.misc.exp_dir or default))


# In order: a check may rely on what the ones before derived (the mode, the resource, the batch).
def check_notify(cfg: RelaxConfig) -> None:
    """--notify-urls: every URL one Apprise knows (relax.utils.notify)."""
    from relax.utils.notify import check_urls

    try:
        check_urls(cfg.logging.notify_urls)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def check_metrics_sinks(cfg: RelaxConfig) -> None:
    """--use-wandb / --use-clearml: their package is installed (relax.utils.metrics_sinks)."""
    from relax.utils.metrics_sinks import enabled_sinks, missing_packages

    missing = missing_packages(enabled_sinks(cfg.logging))
    if missing:
        raise ConfigError("; ".join(missing))


CHECKS = (check_unsupported, check_ranges, check_mode, check_partial_rollout, check_debug, check_external,
          check_resource, check_batches, check_algorithm, check_paths, check_eval, check_context, check_prefetch,
          check_genrm, check_ref_actor_config, check_multimodal, check_true_on_policy, check_backends, check_plugins,
          check_exp_dir, check_notify, check_metrics_sinks, check_fault_flags)


def validate_config(cfg: RelaxConfig) -> RelaxConfig:
    """Every check, in order; returns the config with its derived values (a new, frozen config)."""
    for check in CHECKS:
        cfg = check(cfg) or cfg
    return cfg
