"""Multi-turn (agentic) flags: the environment module loads, and the flags that shape an episode
act (docs/agentic.md).

`--rollout-interaction-env-path` must name a module whose `build_env` takes `sample=` and `args=`
(checked by importing it, before Ray starts). With it the episode needs the engines' context length
to know when an observation no longer fits, so `--rollout-max-context-len` defaults to the model's
`max_position_embeddings` (the engines' own limit, so nothing else changes). The episode flags
(`--max-turns`, `--env-timeout`, `--multi-turn-stop`, `--multi-turn-max-tokens`, `--turn-reward`,
`--log-multi-turn`, `--multi-turn-constrain-tool-calls`) need a multi-turn rollout: an environment, or a
custom generate function (one that runs `relax.engine.agentic.generate`, as the seeds' rollout.py does).
`--multi-turn-constrain-tool-calls` is refused with `--true-on-policy-mode` (the trainer cannot score
a constrained distribution).

`--agent-function-path` (a black-box agent, docs/agents.md) must name an `async def run_episode(base_url,
api_key, sample, **kwargs)`; it excludes the other two ways of generating (a custom generate function,
an environment), the episode flags other than `--log-multi-turn` do not apply to it, and
`--agent-timeout` / `--agent-gateway-host` need it. The gateway needs the context length too.
"""

from __future__ import annotations

import dataclasses

from relax.config.checks.inputs import hf_config
from relax.config.errors import ConfigError
from relax.config.fields import field_default, flag_for
from relax.config.schema import AgenticConfig, RelaxConfig

BUILD_ENV_SIGNATURE = "build_env(sample=..., args=...) -> BaseInteractionEnv"
AGENT_SIGNATURE = "async def run_episode(base_url, api_key, sample, **kwargs)"
AGENT_FLAGS = ("agent_function_path", "agent_timeout", "agent_gateway_host", "agent_tools_in_prompt")
SEGMENT_FLAGS = ("agent_segments",)  # an agent's or a custom generate function's Sample.prior_segments


def check_agentic(cfg: RelaxConfig) -> RelaxConfig | None:
    a = cfg.agentic
    check_segments(cfg)
    if a.agent_function_path:
        check_agent(cfg)
    elif a.rollout_interaction_env_path:
        check_env_module(a.rollout_interaction_env_path)
    elif not cfg.rollout.custom_generate_function_path:
        changed = _changed(a, exclude=AGENT_FLAGS) + (["--log-multi-turn"] if cfg.logging.log_multi_turn else [])
        if changed:
            raise ConfigError(f"{' '.join(changed)} shape(s) multi-turn rollouts, and this run has none: set "
                              "--rollout-interaction-env-path (an environment module with build_env) or a "
                              "--custom-generate-function-path that runs relax.engine.agentic.generate "
                              "(docs/agentic.md)")
    if not a.agent_function_path and _changed(a, only=AGENT_FLAGS):
        raise ConfigError(f"{' '.join(_changed(a, only=AGENT_FLAGS))} configure(s) the black-box agent gateway, and "
                          "this run has no agent: set --agent-function-path (docs/agents.md)")
    if a.multi_turn_constrain_tool_calls and cfg.cluster.true_on_policy_mode:
        raise ConfigError("--multi-turn-constrain-tool-calls constrains what the engine samples, which the trainer "
                          "cannot reproduce under --true-on-policy-mode: drop one of them (docs/true-on-policy.md)")
    if a.multi_turn_stop is not None and not all(isinstance(s, str) and s for s in a.multi_turn_stop):
        raise ConfigError(f"--multi-turn-stop takes non-empty strings, got {a.multi_turn_stop!r}")
    if (a.rollout_interaction_env_path or a.agent_function_path) and cfg.rollout.rollout_max_context_len is None:
        model = hf_config(cfg.ckpt.hf_checkpoint)
        limit = model.get("max_position_embeddings") or (model.get("text_config") or {}).get("max_position_embeddings")
        if limit is not None:  # what the engines allow anyway: the episode needs to know it
            return cfg.replace(rollout_max_context_len=int(limit))
    return None


def _changed(a: AgenticConfig, *, exclude: tuple[str, ...] = (), only: tuple[str, ...] | None = None) -> list[str]:
    """The flags of the group set away from their defaults (all but `exclude`, or only `only`)."""
    return [flag_for(f.name) for f in dataclasses.fields(AgenticConfig)
            if f.name not in exclude and (only is None or f.name in only) and getattr(a, f.name) != field_default(f)]


def check_agent(cfg: RelaxConfig) -> None:
    """--agent-function-path: the one generate function of the run, and an async function that takes
    (base_url, api_key, sample, **kwargs); the built-in episode's flags do not apply to it."""
    a = cfg.agentic
    for flag, value in (("--custom-generate-function-path", cfg.rollout.custom_generate_function_path),
                        ("--rollout-interaction-env-path", a.rollout_interaction_env_path)):
        if value:
            raise ConfigError(f"--agent-function-path and {flag} both say how samples are generated: keep one (a "
                              "black-box agent runs its own tools; docs/agents.md)")
    episode = _changed(a, exclude=(*AGENT_FLAGS, *SEGMENT_FLAGS, "rollout_interaction_env_path"))
    if episode:
        raise ConfigError(f"{' '.join(episode)} shape(s) the built-in multi-turn rollout, not a black-box agent "
                          "(--agent-function-path): the agent decides its turns; bound an episode with "
                          "--agent-timeout and each call with --rollout-max-response-len")
    from relax.utils.plugins import PluginError, load_async_plugin

    try:
        load_async_plugin(a.agent_function_path, flag="--agent-function-path", positional=3,
                          keywords=("args", "evaluation"), expected=AGENT_SIGNATURE)
    except PluginError as exc:
        raise ConfigError(str(exc)) from exc


def check_segments(cfg: RelaxConfig) -> None:
    """--agent-segments all needs an estimator with one advantage per sample, which an episode's
    rows share; the segments come from an agent or a custom generate function."""
    from relax.config.role_plans import SEQUENCE_ESTIMATORS

    a, algo = cfg.agentic, cfg.algo
    if a.agent_segments == "all" and (algo.advantage_estimator not in SEQUENCE_ESTIMATORS or algo.kl_coef != 0):
        raise ConfigError(f"--agent-segments all trains every segment of an episode on the episode's one advantage, "
                          f"which needs --advantage-estimator {' / '.join(SEQUENCE_ESTIMATORS)} and --kl-coef 0 "
                          f"(got {algo.advantage_estimator}, --kl-coef {algo.kl_coef:g}): use --agent-segments "
                          "last or auto (docs/agents.md)")
    if a.agent_segments != "auto" and not (a.agent_function_path or cfg.rollout.custom_generate_function_path):
        raise ConfigError(f"--agent-segments {a.agent_segments} says which segments of an episode train, and only a "
                          "black-box agent (--agent-function-path) or a custom generate function "
                          "(--custom-generate-function-path, Sample.prior_segments) makes them (docs/agents.md)")


def check_env_module(path: str) -> None:
    """`path` imports and its `build_env` takes `sample=` and `args=`; ConfigError naming the flag if not."""
    from relax.utils.plugins import PluginError, load_factory

    try:
        load_factory(path, attr="build_env", flag="--rollout-interaction-env-path", keywords=("sample", "args"),
                     expected=BUILD_ENV_SIGNATURE)
    except PluginError as exc:
        raise ConfigError(str(exc)) from exc
