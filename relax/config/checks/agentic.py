"""Multi-turn (agentic) flags: the environment module loads, and the flags that shape an episode
act (docs/agentic.md).

`--rollout-interaction-env-path` must name a module whose `build_env` takes `sample=` and `args=`
(checked by importing it, before Ray starts). With it the episode needs the engines' context length
to know when an observation no longer fits, so `--rollout-max-context-len` defaults to the model's
`max_position_embeddings` (the engines' own limit, so nothing else changes). The episode flags
(`--max-turns`, `--env-timeout`, `--multi-turn-stop`, `--multi-turn-max-tokens`, `--turn-reward`,
`--log-multi-turn`) need a multi-turn rollout: an environment, or a custom generate function (one
that runs `relax.engine.agentic.generate`, as the seeds' rollout.py does).
"""

from __future__ import annotations

import dataclasses

from relax.config.checks.inputs import hf_config
from relax.config.errors import ConfigError
from relax.config.fields import field_default, flag_for
from relax.config.schema import AgenticConfig, RelaxConfig

BUILD_ENV_SIGNATURE = "build_env(sample=..., args=...) -> BaseInteractionEnv"


def check_agentic(cfg: RelaxConfig) -> RelaxConfig | None:
    a = cfg.agentic
    if a.rollout_interaction_env_path:
        check_env_module(a.rollout_interaction_env_path)
    elif not cfg.rollout.custom_generate_function_path:
        changed = [flag_for(f.name) for f in dataclasses.fields(AgenticConfig)
                   if getattr(a, f.name) != field_default(f)]
        changed += ["--log-multi-turn"] if cfg.logging.log_multi_turn else []
        if changed:
            raise ConfigError(f"{' '.join(changed)} shape(s) multi-turn rollouts, and this run has none: set "
                              "--rollout-interaction-env-path (an environment module with build_env) or a "
                              "--custom-generate-function-path that runs relax.engine.agentic.generate "
                              "(docs/agentic.md)")
    if a.multi_turn_stop is not None and not all(isinstance(s, str) and s for s in a.multi_turn_stop):
        raise ConfigError(f"--multi-turn-stop takes non-empty strings, got {a.multi_turn_stop!r}")
    if a.rollout_interaction_env_path and cfg.rollout.rollout_max_context_len is None:
        model = hf_config(cfg.ckpt.hf_checkpoint)
        limit = model.get("max_position_embeddings") or (model.get("text_config") or {}).get("max_position_embeddings")
        if limit is not None:  # what the engines allow anyway: the episode needs to know it
            return cfg.replace(rollout_max_context_len=int(limit))
    return None


def check_env_module(path: str) -> None:
    """`path` imports and its `build_env` takes `sample=` and `args=`; ConfigError naming the flag if not."""
    from relax.utils.plugins import PluginError, load_factory

    try:
        load_factory(path, attr="build_env", flag="--rollout-interaction-env-path", keywords=("sample", "args"),
                     expected=BUILD_ENV_SIGNATURE)
    except PluginError as exc:
        raise ConfigError(str(exc)) from exc
