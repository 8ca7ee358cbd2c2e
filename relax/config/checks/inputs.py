"""The run's inputs name files that exist and fit the model: `--hf-checkpoint` (its config.json),
`--prompt-data`, the eval sets (`--eval-config` / `--eval-prompt-data`), the context limits
against the model's `max_position_embeddings`, the prefetch buffer and the multimodal keys.

Only what the flags name is checked here; the rows of the data files are read by
`relax.config.preflight` once every flag is known to be right.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from relax.config.checks.megatron import text_model_config
from relax.config.checks.plugins import check_plugin
from relax.config.errors import ConfigError
from relax.config.eval_config import eval_datasets
from relax.config.schema import RelaxConfig

logger = logging.getLogger(__name__)


def hf_config(path: str) -> dict:
    """The checkpoint's config.json (`--hf-checkpoint`), as a dict."""
    cfg_file = Path(path) / "config.json"
    if not cfg_file.is_file():
        raise ConfigError(f"--hf-checkpoint {path}: no config.json there; point it at an HF model directory")
    return json.loads(cfg_file.read_text())


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


def check_paths(cfg: RelaxConfig) -> None:
    """--hf-checkpoint and --prompt-data are given and exist; --save-interval has a --save."""
    if not cfg.ckpt.hf_checkpoint:
        raise ConfigError("--hf-checkpoint is required (HF model directory: tokenizer, architecture, weights)")
    hf_config(cfg.ckpt.hf_checkpoint)
    if cfg.ckpt.save_interval is not None and not cfg.ckpt.save:
        raise ConfigError("--save-interval needs --save (where to write checkpoints)")
    if cfg.ckpt.rotate_ckpt and not (cfg.ckpt.save and cfg.ckpt.save_interval):
        raise ConfigError("--rotate-ckpt saves every step and keeps the latest plus the --save-interval ones: it needs "
                          "--save DIR and --save-interval N")
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
            check_plugin(generate_path, f"{source} {dataset.name}: custom_generate_function_path", 3,
                          "generate(args, sample, sampling_params[, evaluation])")
    if cfg.eval.eval_config and cfg.eval.eval_prompt_data:
        logger.warning("--eval-config is set: it replaces --eval-prompt-data %s", cfg.eval.eval_prompt_data)


def check_context(cfg: RelaxConfig) -> None:
    """Context limits fit the model (max_position_embeddings) and leave room for a response."""
    limit = hf_config(cfg.ckpt.hf_checkpoint).get("max_position_embeddings")
    for flag, value in (("--rollout-max-context-len", cfg.rollout.rollout_max_context_len),
                        ("--eval-max-context-len", cfg.eval.eval_max_context_len)):
        if value is None:
            continue
        if value < 2:
            raise ConfigError(f"{flag} must be >= 2 (prompt + at least one response token), got {value}")
        if limit is not None and value > int(limit):
            raise ConfigError(f"{flag} {value} exceeds the model's max_position_embeddings {limit} "
                              f"({cfg.ckpt.hf_checkpoint}/config.json); lower it")


def default_response_len(cfg: RelaxConfig) -> RelaxConfig:
    """--rollout-max-response-len is optional, as in the seeds (SGLang's max_tokens unset: generate
    until the context is full): default = the context length (--rollout-max-context-len, else
    the model's max_position_embeddings) minus --rollout-max-prompt-len when that is set."""
    r = cfg.rollout
    if r.rollout_max_response_len is not None:
        return cfg
    hf = hf_config(cfg.ckpt.hf_checkpoint)
    context = r.rollout_max_context_len or text_model_config(hf).get("max_position_embeddings") or hf.get(
        "max_position_embeddings")
    if not context:
        raise ConfigError("--rollout-max-response-len is unset and the context length is unknown (no "
                          f"--rollout-max-context-len, no max_position_embeddings in {cfg.ckpt.hf_checkpoint}/"
                          "config.json): set --rollout-max-response-len N (max new tokens per response)")
    prompt = r.rollout_max_prompt_len or 0
    if prompt >= int(context):
        raise ConfigError(f"--rollout-max-prompt-len {prompt} leaves no room for a response in the context length "
                          f"{context}; set --rollout-max-response-len N or a longer --rollout-max-context-len")
    logger.info("--rollout-max-response-len unset: %d (context %s - max prompt %d)", int(context) - prompt, context,
                prompt)
    return cfg.replace(rollout_max_response_len=int(context) - prompt)


def check_prefetch(cfg: RelaxConfig) -> None:
    d = cfg.data
    for flag, value, least in (("--prefetch-chunk-size", d.prefetch_chunk_size, 1),
                               ("--prefetch-num-workers", d.prefetch_num_workers, 1),
                               ("--prefetch-max-cached", d.prefetch_max_cached, 0)):
        if value < least:
            raise ConfigError(f"{flag} must be >= {least}, got {value}"
                              + (" (0 disables prefetching)" if flag == "--prefetch-max-cached" else ""))


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
