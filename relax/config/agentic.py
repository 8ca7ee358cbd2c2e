"""The multi-turn and black-box agent flags (`AgenticConfig`, the `agentic` group of
`relax.config.schema`): how an episode runs (docs/agentic.md) and how a black-box agent's
episodes reach training (docs/agents.md). Checked by `relax.config.checks.agentic`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from relax.config.fields import opt, parse_bool


@dataclass(frozen=True)
class AgenticConfig:
    """Multi-turn (agentic) rollouts: model turn, environment step, observation, repeated (docs/agentic.md)."""

    rollout_interaction_env_path: str | None = opt(
        None, "Module of the interaction environment, exposing build_env(sample=, args=) -> a BaseInteractionEnv "
        "(relax.engine.agentic). Set, the built-in multi-turn rollout generates every sample unless "
        "--custom-generate-function-path names another generate function (docs/agentic.md). The seeds set it in "
        "--custom-config-path YAML; the flag is the same.")
    max_turns: int = opt(5, "Most model turns of a multi-turn sample (termination max_turns).")
    env_timeout: float = opt(60.0, "Seconds one environment call (build_env, reset, step, close) may take; a call "
                             "that times out or raises ends its sample (status failed, termination env_timeout or "
                             "env_error, its tokens not trained on), never the run.")
    multi_turn_stop: list | None = opt(None, "Strings that end a multi-turn episode when a model turn contains one "
                                       "(termination stop), e.g. '</answer>'; --rollout-stop ends a turn.",
                                       nargs="+")
    multi_turn_max_tokens: int | None = opt(None, "Most response tokens (model turns and observations) of one "
                                            "multi-turn sample: the episode ends (termination token_budget) when "
                                            "the next turn or observation would not fit (--rollout-max-context-len "
                                            "bounds prompt + response too).")
    turn_reward: Literal["final", "sum"] = opt("final", "How environment step rewards (a step's info['reward']) "
                                               "join the reward function's score: final = the score alone (step "
                                               "rewards are recorded in metadata['turn_rewards']); sum = score + "
                                               "the sum of step rewards.")
    agent_function_path: str | None = opt(
        None, "A black-box agent: async def run_episode(base_url, api_key, sample, **kwargs), written against an "
        "OpenAI client. Set, every sample's episode runs it against the rollout's agent gateway, which records "
        "each call's token ids, log-probs and weight version (docs/agents.md). Excludes "
        "--custom-generate-function-path and --rollout-interaction-env-path.")
    agent_timeout: float = opt(300.0, "Seconds one black-box agent episode may take; an episode that times out (or "
                               "whose agent raises) ends its sample (status failed, termination agent_timeout or "
                               "agent_error, its tokens not trained on), never the run.")
    agent_segments: Literal["auto", "all", "last"] = opt(
        "auto", "What trains when an agent rewrote its history, so its episode has several segments (prompts "
        "that do not extend each other; Sample.prior_segments): all = every segment is a training row that shares "
        "the episode's reward and advantage (estimators with one advantage per sample: grpo, gspo, sapo, "
        "on_policy_distillation, and --kl-coef 0); last = only the last segment, which holds the answer; auto = "
        "all where the estimator allows it, else last (docs/agents.md).")
    agent_gateway_host: str = opt("127.0.0.1", "Address the agent gateway binds (an OpenAI-compatible server in "
                                  "the Rollout process, on a free port). Loopback by default: an agent elsewhere "
                                  "needs this set, and each session's key is its only guard then.")
    agent_tools_in_prompt: bool = opt(True, "Render a request's `tools` into the prompt through the chat template "
                                      "(what any OpenAI server does). false: the tools are only declared (their "
                                      "calls are still parsed into tool_calls) and the prompt is the messages "
                                      "alone, for a policy trained to know its tools from its system message "
                                      "(docs/agents.md).", type=parse_bool)
    multi_turn_constrain_tool_calls: bool = opt(
        False, "Make every model turn's tool calls parse: each turn is sent with a structural_tag constraint under "
        "which the text stays free and every <tool_call> the policy starts is completed as JSON {\"name\": one "
        "of the sample's tools (metadata['tools'], --tool-key), \"arguments\": that tool's parameters} (any "
        "name and object without tools). Applied by the engine's grammar (hf: llguidance; sglang: its grammar "
        "backend); the log-probs are the constrained distribution's. Not with --true-on-policy-mode "
        "(docs/agentic.md).", type=parse_bool)
