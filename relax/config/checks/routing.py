"""Routing replay flags (MoE, docs/moe.md): `--use-rollout-routing-replay` (R3) and
`--use-routing-replay` act on MoE models whose routers the trainers can replay, and R3 implies
`--use-routing-replay` (the seeds' rule; derived here, once).

Rejected, each with the fix: a dense checkpoint; a model family whose routers are not the softmax
top-k kind the engine and the trainers replay; either flag with --true-on-policy-mode (the engine
rescores every response with the trainer's numerics, which already routes as the trainer does, and
that row-by-row path replays nothing); R3 with a
black-box agent (--agent-function-path: the gateway records no routing); `--use-routing-replay`
alone on megatron with tensor, pipeline or context parallelism (a rank then routes a share of each
row: recording whole rows across ranks is not built); either flag on megatron with pipeline
parallelism and full recomputation (the schedule interleaves micro-batches between a forward and
its recomputation). The SGLang version is the sglang backend's
to check (`relax.backends.sglang.routing`), through the engine option check.
"""

from __future__ import annotations

from relax.config.checks.inputs import hf_config
from relax.config.checks.megatron import text_model_config
from relax.config.errors import ConfigError
from relax.config.schema import RelaxConfig

# Model types (config.json) whose MoE routers are softmax top-k ones (relax.utils.routing_replay).
REPLAY_MODEL_TYPES = ("qwen2_moe", "qwen3_moe", "qwen3_vl_moe", "qwen3_omni_moe", "qwen3_omni_moe_thinker",
                      "qwen3_5_moe", "mixtral", "olmoe")
EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")


def check_routing_replay(cfg: RelaxConfig) -> RelaxConfig | None:
    """The flags fit the model and the run; R3 turns --use-routing-replay on."""
    a = cfg.algo
    if not (a.use_routing_replay or a.use_rollout_routing_replay):
        return None
    flag = "--use-rollout-routing-replay" if a.use_rollout_routing_replay else "--use-routing-replay"
    check_moe_model(cfg, flag)
    if cfg.cluster.true_on_policy_mode:
        raise ConfigError(f"{flag} with --true-on-policy-mode: the engine rescores every response with the trainer's "
                          "computation (one unpadded row), which routes as the trainer does, and that row-by-row "
                          "path replays no routing; drop one of the two")
    check_pipeline_recompute(cfg, flag)
    if a.use_rollout_routing_replay:
        check_rollout_replay(cfg)
    else:
        check_recorded_replay(cfg)
    return cfg.replace(use_routing_replay=True) if not a.use_routing_replay else None


def check_moe_model(cfg: RelaxConfig, flag: str) -> None:
    hf = hf_config(cfg.ckpt.hf_checkpoint)
    text = text_model_config(hf)
    model_type = hf.get("model_type")
    if not any(text.get(k) for k in EXPERT_KEYS) or not text.get("num_experts_per_tok"):
        raise ConfigError(f"{flag}: {cfg.ckpt.hf_checkpoint} is a dense model (model type {model_type!r}, no "
                          "num_experts / num_experts_per_tok in its config.json); routing replay is for MoE models: "
                          "drop the flag")
    if model_type not in REPLAY_MODEL_TYPES:
        raise ConfigError(f"{flag}: model type {model_type!r} is MoE, but its routers are not of the softmax top-k "
                          f"kind Relax replays ({', '.join(REPLAY_MODEL_TYPES)}); drop the flag")


def check_pipeline_recompute(cfg: RelaxConfig, flag: str) -> None:
    """megatron's 1F1B schedule runs the next micro-batch's forward before this one's backward, so a
    layer recomputed in backward would route with the next micro-batch's record."""
    p = cfg.parallel
    if cfg.cluster.train_backend == "megatron" and (p.pipeline_model_parallel_size or 1) > 1 and \
            p.recompute_granularity == "full":
        raise ConfigError(f"{flag} with --pipeline-model-parallel-size {p.pipeline_model_parallel_size} and "
                          "--recompute-granularity full: replaying routing in a layer recomputed under the pipeline "
                          "schedule is not built; drop the recomputation or use --pipeline-model-parallel-size 1")


def check_rollout_replay(cfg: RelaxConfig) -> None:
    if cfg.agentic.agent_function_path:
        raise ConfigError("--use-rollout-routing-replay with --agent-function-path: the agent gateway does not record "
                          "the engine's routed experts yet; use the built-in multi-turn rollout "
                          "(--rollout-interaction-env-path) or drop the flag")


def check_recorded_replay(cfg: RelaxConfig) -> None:
    """--use-routing-replay without R3: the first forward records whole rows on one rank."""
    p = cfg.parallel
    split = {"--tensor-model-parallel-size": p.tensor_model_parallel_size,
             "--pipeline-model-parallel-size": p.pipeline_model_parallel_size,
             "--context-parallel-size": p.context_parallel_size}
    split = {name: size for name, size in split.items() if (size or 1) > 1}
    if cfg.cluster.train_backend == "megatron" and split:
        named = ", ".join(f"{name} {size}" for name, size in split.items())
        raise ConfigError(f"--use-routing-replay on megatron with {named}: recording a row's routing that ranks "
                          "share is not built; use --use-rollout-routing-replay (the engine's routing, replayed "
                          "under any layout) or data/expert parallelism only")


def routing_summary(cfg: RelaxConfig) -> list[str]:
    """The run plan's line on routing replay (`relax-train --dry-run`)."""
    a = cfg.algo
    if a.use_rollout_routing_replay:
        return ["routing replay: R3, every forward of a row (old log-probs, training, reference) replays the experts "
                "the engine routed it to (column rollout_routed_experts; docs/moe.md)"]
    if a.use_routing_replay:
        return ["routing replay: the first forward over a step's rows records their experts, the later passes "
                "over them replay it (docs/moe.md)"]
    return []
