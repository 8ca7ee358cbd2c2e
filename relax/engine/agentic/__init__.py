"""Agentic (multi-turn) rollouts: an environment per sample, model turns and observations in one
token sequence, termination, per-turn rewards and trajectory logs (docs/agentic.md).

- `env`: `BaseInteractionEnv` (reset / step / format_observation / close), loading `build_env`,
  calling an environment safely (timeouts, failures become a sample's status);
- `observation`: observation -> ids through the chat template's own turn delimiters;
- `episode`: the turn loop and its terminations;
- `rollout`: the generate function (`generate`, `multi_turn_generate`) and the true on-policy
  rescoring;
- `records`: per-step metrics, reward combination and the trajectory log;
- `tool_calls`: tool calls in a model turn's text (Qwen's `<tool_call>` format);
- `adapters`: environments served as services (OpenEnv servers, MCP tool servers) as `BaseInteractionEnv`s;
- `agent`, `gateway`, `gateway_session`, `gateway_protocol`: black-box agents (--agent-function-path)
  calling the policy through an OpenAI-compatible gateway that records every call token-in/token-out
  (docs/agents.md).
"""

from typing import Any

from relax.engine.agentic.env import BaseInteractionEnv, EnvFailure, Observation
from relax.engine.agentic.episode import TERMINATIONS

__all__ = ["TERMINATIONS", "BaseInteractionEnv", "EnvFailure", "Observation", "episode_generate", "generate",
           "multi_turn_generate"]


def episode_generate(generator: Any) -> Any:
    """The generate function of `generator`'s episodes (what `Generator(episodes=...)` takes): the
    black-box agent through the gateway with --agent-function-path, the built-in multi-turn rollout
    with --rollout-interaction-env-path, else None (single-turn samples)."""
    agentic = generator.spec.agentic
    if agentic.agent_path:
        from relax.engine.agentic.agent import agent_generate

        return agent_generate(generator)
    if agentic.env_path:
        from relax.engine.agentic.rollout import default_generate

        return default_generate(generator)
    return None


def __getattr__(name: str) -> Any:
    """`generate` / `multi_turn_generate` on first use: the rollout module builds on the generator,
    which imports this package (`records`)."""
    if name in ("generate", "multi_turn_generate"):
        from relax.engine.agentic import rollout

        return getattr(rollout, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
