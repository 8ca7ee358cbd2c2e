"""The Rollout role's engines, as the config launches them: their launch options (SGLang `ServerArgs`
names, or what the hf engine takes of the --sglang-* flags), the defaults every generate request carries,
and the context length they must hold. Pure functions of the config, apart from the Rollout that uses
them, so they are read and tested on their own.
"""

from __future__ import annotations

import logging
from typing import Any

from relax.config.eval_config import EvalDataset
from relax.config.lora import ADAPTER_NAME, engine_lora_options, lora_spec
from relax.config.schema import RelaxConfig

logger = logging.getLogger(__name__)


def generate_defaults(cfg: RelaxConfig) -> dict[str, Any] | None:
    """--lora-rank on engines that serve adapters by name (SGLang): every request names the adapter."""
    from relax.backends.registry import ADAPTER_FILE_ENGINES

    if lora_spec(cfg) is None or cfg.cluster.rollout_backend not in ADAPTER_FILE_ENGINES:
        return None
    return {"lora_path": ADAPTER_NAME}


def engine_options(cfg: RelaxConfig, context_len: int | None) -> dict[str, Any] | None:
    """Launch options of the rollout engines (SGLang `ServerArgs` names; see ENGINE_OPTIONS).
    sglang gets every --sglang-* option (checked by SGLang's parser at config time), its
    tensor parallel size, the context limit as `context_length`, and in colocate SGLang's memory
    saver, without which `/release_memory_occupation` frees nothing."""
    if cfg.cluster.rollout_backend == "sglang":
        from relax.config.plan import releases_engine_memory

        options = {**cfg.sglang, "tp_size": cfg.cluster.rollout_num_gpus_per_engine}
        options.pop("tensor_parallel_size", None)  # the long name of tp_size: config validation made them agree
        if context_len:
            options["context_length"] = context_len
        if releases_engine_memory(cfg):
            options.setdefault("enable_memory_saver", True)
        if cfg.algo.use_rollout_routing_replay:  # R3: SGLang >= 0.5.8 (checked by the launcher)
            options["enable_return_routed_experts"] = True
        return options | engine_lora_options(cfg, alpha=False)  # SGLang reads alpha from adapter_config.json
    # --sglang-<option> passthrough: what this backend understands goes to the engines.
    from relax.backends.registry import engine_options as backend_engine_options

    known = backend_engine_options(cfg.cluster.rollout_backend)
    options: dict[str, Any] = {k: v for k, v in cfg.sglang.items() if known is None or k in known}
    ignored = sorted(set(cfg.sglang) - set(options))
    if ignored:
        logger.info("--sglang-* options the %s engine does not use: %s", cfg.cluster.rollout_backend, ignored)
    if context_len:
        options["max_context_len"] = context_len
    if cfg.cluster.true_on_policy_mode:
        # Report log-probs with the fsdp trainer's numerics, on the trainer's float32 weights.
        options.update(rl_on_policy_target="fsdp", dtype="float32")
    options.update(engine_lora_options(cfg, alpha=True))  # --lora-rank: adapters the pushes fill
    if cfg.algo.use_rollout_routing_replay:  # R3: the engines record every token's experts (docs/moe.md)
        options["enable_return_routed_experts"] = True
    return options or None


def engine_context_len(rollout_limit: int | None, datasets: list[EvalDataset]) -> int | None:
    """The engines' context length: the largest limit any request may use (None: the model's own),
    since each request is cut to its own limit before it is sent."""
    limits = [rollout_limit] + [d.max_context_len for d in datasets]
    if rollout_limit is None:  # training requests are unlimited: the engine keeps the model's limit
        return None
    return max(v for v in limits if v is not None)
