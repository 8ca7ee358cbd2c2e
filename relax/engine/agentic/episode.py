"""One multi-turn episode: model turn -> environment step -> observation, until it terminates.

Per sample, with its own environment:

    tokens = prompt ids
    loop:
        model turn: /generate(input_ids=tokens) -> the engine's output ids appended (loss mask 1,
                    the engine's log-probs); its text (decoded for the environment only) ->
        a stop string in it?                          -> stop
        env.step(text) -> (observation, done, info)   (info: reward, tool_call)
        done?                                         -> env_done
        turns == --max-turns?                         -> max_turns
        observation ids (observation.py) appended (loss mask 0, log-prob 0); if they do not fit
        the budget                                    -> token_budget
    a turn cut by its length, the context or --multi-turn-max-tokens    -> token_budget
    an environment call that raised / timed out                         -> env_error / env_timeout

Termination -> status: env_done, max_turns, stop: completed; token_budget: truncated; env_error,
env_timeout: failed, and every token's loss mask 0 (an environment fault is not the policy's
doing; the sample stays in its group). Recorded in `sample.metadata`: `turns` (model turns),
`termination`, `tool_calls`, `turn_rewards` (the steps' info["reward"]), `env_error` (the
message), and with --log-multi-turn `trajectory` (every turn's text, tokens, info).

Partial rollout: a model turn a weight push aborts comes back with its tokens so far; the
episode is parked (`PARKED`, keyed by the sample) and the sample returned aborted, as the
generate contract asks. `Generator`'s `resume_until_done` books the abort and calls again; the
parked episode (its environment and media) continues the same turn from `sample.tokens` with
the turn's budget left.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any

from relax.engine.agentic.env import ENV_ERROR, ENV_TIMEOUT, EnvFailure, as_observation, as_step, build_env, call_env
from relax.engine.rollout.partial_rollout import is_resuming
from relax.types import Sample

ENV_DONE, MAX_TURNS, TOKEN_BUDGET, STOP = "env_done", "max_turns", "token_budget", "stop"
TERMINATIONS = (ENV_DONE, MAX_TURNS, TOKEN_BUDGET, STOP, ENV_ERROR, ENV_TIMEOUT)
# A black-box agent's episode (agent.py) ends with one of these instead.
AGENT_DONE, AGENT_ERROR, AGENT_TIMEOUT = "agent_done", "agent_error", "agent_timeout"
AGENT_TERMINATIONS = (AGENT_DONE, TOKEN_BUDGET, AGENT_ERROR, AGENT_TIMEOUT)
STATUS = {ENV_DONE: Sample.Status.COMPLETED, MAX_TURNS: Sample.Status.COMPLETED, STOP: Sample.Status.COMPLETED,
          TOKEN_BUDGET: Sample.Status.TRUNCATED, ENV_ERROR: Sample.Status.FAILED, ENV_TIMEOUT: Sample.Status.FAILED,
          AGENT_DONE: Sample.Status.COMPLETED, AGENT_ERROR: Sample.Status.FAILED, AGENT_TIMEOUT: Sample.Status.FAILED}
PARKED: dict[int, Episode] = {}  # id(sample) -> its episode while the sample waits to resume an aborted turn


@dataclass(eq=False)
class Episode:
    env: Any
    media: Any  # relax.utils.multimodal.turns.MediaContext (None in a text run)
    prompt_length: int
    turns: int = 0  # model turns finished
    turn_start: int = 0  # where the current model turn begins in sample.tokens
    open_turn: bool = False  # a turn an abort interrupted (continued on resume)
    requests: int = 0  # /generate calls so far
    tool_calls: int = 0
    turn_rewards: list[float] = field(default_factory=list)
    trajectory: list[dict[str, Any]] | None = None


async def run(ctx: Any, sample: Sample, params: dict[str, Any], evaluation: bool) -> Sample:
    """Play (or resume) `sample`'s episode to its end; `ctx`: an `EpisodeContext` (rollout.py).
    The environment is closed however the episode ends (an engine error or a cancellation too),
    unless the episode is parked to resume an aborted turn."""
    episode = PARKED.pop(id(sample), None) if is_resuming(sample) else None
    parked = False
    try:
        if episode is None:
            episode = await start(ctx, sample, evaluation)
        termination = await play(ctx, episode, sample, params)
        if termination is None:  # aborted mid-turn: parked until the generator resumes it
            PARKED[id(sample)] = episode
            weakref.finalize(sample, PARKED.pop, id(sample), None)
            parked = True
            return sample
    except EnvFailure as failure:
        termination = failure.kind
        sample.metadata["env_error"] = str(failure)
        if episode is None:  # build_env or reset failed: the prompt alone, nothing to train on
            episode = Episode(env=None, media=None, prompt_length=len(sample.tokens))
    finally:
        if not parked:
            await close(ctx, episode, sample)
    return await ctx.finish(sample, episode, termination, params)


async def start(ctx: Any, sample: Sample, evaluation: bool) -> Episode:
    """Encode the prompt, build and reset the environment."""
    ids, _ = await ctx.encoder.encode(sample)
    sample.tokens, sample.response, sample.response_length = list(ids), "", 0
    sample.loss_mask, sample.rollout_log_probs, sample.weight_versions = [], [], []
    sample.rollout_routed_experts = None  # R3: the episode's routing record starts with its first turn
    episode = Episode(env=None, media=ctx.media_context(sample), prompt_length=len(ids),
                      trajectory=[] if ctx.spec.log_trajectories else None)
    timeout = ctx.spec.env_timeout
    try:
        episode.env = await build_env(ctx.env_path, sample, ctx.args, evaluation=evaluation, timeout=timeout)
        reset = await call_env(episode.env.reset, timeout=timeout, what="reset")
        if not isinstance(reset, tuple) or len(reset) != 2:
            raise EnvFailure(ENV_ERROR, f"reset must return (observation, info), got {str(reset)[:200]}")
        record(episode, "reset", text=as_observation(reset[0]).get("obs_str", ""), info=reset[1])
    except EnvFailure:
        await close(ctx, episode, sample)
        raise
    except ValueError as exc:
        await close(ctx, episode, sample)
        raise EnvFailure(ENV_ERROR, f"reset returned a bad observation: {exc}") from exc
    return episode


async def play(ctx: Any, episode: Episode, sample: Sample, params: dict[str, Any]) -> str | None:
    """Turns until a termination (returned), or None when a model turn was aborted."""
    while True:
        finish = await ctx.model_turn(episode, sample, params)
        if finish == "abort":
            return None
        if finish == "no_room":  # the context or the token budget is used up before this turn
            return TOKEN_BUDGET
        episode.open_turn = False
        episode.turns += 1
        text = ctx.decode(sample.tokens[episode.turn_start:])
        record(episode, "assistant", text=text, tokens=len(sample.tokens) - episode.turn_start, finish=finish)
        if finish == "length":
            return TOKEN_BUDGET
        if any(stop in text for stop in ctx.spec.stop):
            return STOP
        obs, done, info = as_step(await call_env(episode.env.step, text, timeout=ctx.spec.env_timeout, what="step"))
        account(episode, obs, done, info)
        if done:
            return ENV_DONE
        if episode.turns >= ctx.spec.max_turns:
            return MAX_TURNS
        if not await observe(ctx, episode, sample, obs, info):
            return TOKEN_BUDGET


def account(episode: Episode, obs: dict[str, Any], done: bool, info: dict[str, Any]) -> None:
    """A step's reward and tool calls (module doc of env.py: info["reward"], info["tool_call"])."""
    if info.get("reward") is not None:
        episode.turn_rewards.append(float(info["reward"]))
    calls = info.get("tool_call")
    episode.tool_calls += int(calls) if calls is not None else int(not done)


async def observe(ctx: Any, episode: Episode, sample: Sample, obs: dict[str, Any], info: dict[str, Any]) -> bool:
    """Append the observation's ids (loss mask 0, log-prob 0); False when they do not fit the budget."""
    try:
        message = episode.env.format_observation(obs) if hasattr(episode.env, "format_observation") else \
            {"role": obs.get("role") or "user", "content": obs.get("obs_str", "")}
        ids, text, media = ctx.observation_ids(message, sample.tokens[-1], episode.media)
    except (TypeError, ValueError, KeyError) as exc:  # the environment's observation cannot be encoded
        raise EnvFailure(ENV_ERROR, f"observation after turn {episode.turns}: {exc}") from exc
    record(episode, message.get("role", "user"), text=obs.get("obs_str", ""), tokens=len(ids),
           media={k: len(v) for k, v in media.items()}, info=info)
    if not ctx.fits(sample, len(ids) + 1):  # the observation and at least one more model token
        return False
    sample.tokens = sample.tokens + ids
    sample.response_length += len(ids)
    sample.loss_mask = sample.loss_mask + [0] * len(ids)
    sample.rollout_log_probs = sample.rollout_log_probs + [0.0] * len(ids)
    return True


def record(episode: Episode, role: str, **entry: Any) -> None:
    if episode.trajectory is not None:
        episode.trajectory.append({"role": role, **entry})


async def close(ctx: Any, episode: Episode | None, sample: Sample) -> None:
    """Close the environment (a failure to close is recorded, not raised)."""
    if episode is None or episode.env is None or not hasattr(episode.env, "close"):
        return
    env, episode.env = episode.env, None
    try:
        await call_env(env.close, timeout=ctx.spec.env_timeout, what="close")
    except EnvFailure as failure:
        sample.metadata["env_close_error"] = str(failure)
