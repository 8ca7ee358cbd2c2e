"""Black-box agents as the rollout's generate function (`--agent-function-path`, docs/agents.md).

The agent is the user's own code, written against an OpenAI client; it never sees token ids. Per
sample (every sample of a group concurrently, each with its own session):

    open a gateway session (a random id and key; the sample's sampling params)
    await run_episode(base_url, api_key, sample, args=<plugin args>, evaluation=<bool>)
        under --agent-timeout; base_url = http://127.0.0.1:<port>/sessions/<id>/v1
    close the session (a later call of the agent is a 404)
    the sample = the episode's LAST segment (gateway_session.py): tokens = its first prompt + every
        call's new-message ids and the engine's completion ids; loss mask 1 on completion ids only;
        rollout log-probs the engine's (0 elsewhere); weight versions one per request; the earlier
        segments, built the same way, in `sample.prior_segments` (with --agent-segments all/auto)

Terminations: `agent_done` (the agent returned; completed), `token_budget` (the last call was cut
by its length, or a call found no room in the context; truncated), `agent_error` (the agent
raised, or returned without calling the model; its message in `metadata["agent_error"]`) and
`agent_timeout` (failed). A failed sample keeps its tokens with loss mask 0 and stays in its GRPO
group; the run goes on.

Segments: the generate contract returns ONE sample per prompt sample (a GRPO group keeps its
size). An episode whose agent rewrote its history (a summary, a dropped turn) has several
segments; the last one, which holds the final answer, is the sample that is scored. The earlier
ones ride along in `sample.prior_segments` and become training rows of their own that share the
episode's reward and advantage (`--agent-segments`: all, or auto with an estimator that gives one
advantage per sample); with `last` they are dropped. `metadata["agent_segments"]` counts the
segments and `metadata["agent_untrained_calls"]` the calls no row trains on.

Reward (one rule): the run's reward function scores the final sample as usual; its `response` is
the last segment's response decoded (completions and the messages between them). Whatever
`run_episode` returns is kept, JSON-able, in `metadata["agent_return"]`, for a custom reward
function (`--custom-rm-path`) that wants the agent's own verdict.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from dataclasses import dataclass
from typing import Any, Callable

from relax.engine.agentic.episode import AGENT_DONE, AGENT_ERROR, AGENT_TIMEOUT, STATUS, TOKEN_BUDGET
from relax.engine.agentic.gateway import gateway_for
from relax.engine.agentic.gateway_session import RunContext, Segment, Session
from relax.engine.agentic.observation import ObservationEncoder
from relax.types import Sample
from relax.utils.plugins import load_async_plugin

logger = logging.getLogger(__name__)

AGENT_SIGNATURE = "async def run_episode(base_url, api_key, sample, **kwargs)"
AGENT_KEYWORDS = ("args", "evaluation")  # what run_episode is called with besides the three positionals
CANCEL_GRACE_S = 5.0  # a timed-out agent gets this long to unwind its cancellation


def load_agent(path: str) -> Callable[..., Any]:
    """The agent function, checked as the config check does (PluginError naming the flag)."""
    return load_async_plugin(path, flag="--agent-function-path", positional=3, keywords=AGENT_KEYWORDS,
                             expected=AGENT_SIGNATURE)


@dataclass(eq=False)
class AgentContext:
    """Everything the episodes of one generator share."""

    agent: Callable[..., Any]
    run: RunContext
    host: str
    timeout: float
    encoder: Any  # relax.engine.rollout.prompt_encoding.PromptEncoder (a sample the agent never called for)
    tokenizer: Any
    skip_special_tokens: bool
    train_segments: bool = False  # --agent-segments resolved: earlier segments ride in Sample.prior_segments

    @classmethod
    def of(cls, generator: Any) -> AgentContext:
        spec = generator.spec
        kwargs = dict(spec.agentic.template_kwargs)
        name = os.path.basename(str(getattr(generator.tokenizer, "name_or_path", "") or "").rstrip("/"))
        run = RunContext(tokenizer=generator.tokenizer, url=generator.router_url, http_timeout=spec.http_timeout,
                         max_context_len=spec.sampling.max_context_len,
                         observations=ObservationEncoder(generator.tokenizer, kwargs), template_kwargs=kwargs,
                         model_name=name or "relax-policy", log_trajectory=spec.agentic.log_trajectories,
                         tools_in_prompt=spec.agentic.tools_in_prompt)
        return cls(agent=load_agent(spec.agentic.agent_path), run=run, host=spec.agentic.gateway_host,
                   timeout=spec.agentic.agent_timeout, encoder=generator.encoder, tokenizer=generator.tokenizer,
                   skip_special_tokens=spec.sampling.skip_special_tokens,
                   train_segments=spec.agentic.train_segments)


def agent_generate(generator: Any) -> Callable[..., Any]:
    """The generate function a `Generator` runs with --agent-function-path (module doc)."""
    ctx = AgentContext.of(generator)

    async def generate(args: Any, sample: Sample, sampling_params: dict[str, Any], evaluation: bool = False
                       ) -> Sample:
        return await run_episode(ctx, args, sample, sampling_params, evaluation)

    return generate


async def run_episode(ctx: AgentContext, args: Any, sample: Sample, params: dict[str, Any],
                      evaluation: bool) -> Sample:
    """One sample's episode through the gateway, then its sample (module doc)."""
    gateway = await gateway_for(ctx.host)
    session = gateway.open(ctx.run, params)
    sample.session_id = session.id
    try:
        call = ctx.agent(gateway.base_url(session), session.key, sample, args=args, evaluation=evaluation)
        termination, error, result = await _supervise(call, ctx.timeout)
    finally:
        gateway.close(session)
    if error is not None:  # the agent's fault ends its sample, never the run (counted: multi_turn/agent_errors)
        logger.warning("sample %s: %s: %s", sample.index, termination, error)
    return await finish(ctx, sample, session, termination, error, result)


async def _supervise(call: Any, timeout: float) -> tuple[str, str | None, Any]:
    """Await the agent's coroutine under `timeout`: (termination, error message, its return value)."""
    task = asyncio.ensure_future(call)
    try:
        done, _ = await asyncio.wait({task}, timeout=timeout)
    finally:
        if not task.done():
            task.cancel()
    if not done:
        await asyncio.wait({task}, timeout=CANCEL_GRACE_S)
        return AGENT_TIMEOUT, f"the agent did not return within --agent-timeout {timeout:g} s", None
    if task.cancelled():
        return AGENT_ERROR, "the agent's task was cancelled", None
    exc = task.exception()
    if exc is not None:
        return AGENT_ERROR, f"{type(exc).__name__}: {exc}"[:2000], None
    return AGENT_DONE, None, task.result()


async def finish(ctx: AgentContext, sample: Sample, session: Session, termination: str, error: str | None,
                 result: Any) -> Sample:
    """The sample from the session's last segment: tokens, masks, status and metadata (module doc)."""
    segment = session.segments[-1] if session.segments else None
    if segment is None:  # no call: the row's prompt alone, nothing to train on
        ids, _ = await ctx.encoder.encode(sample)
        segment = Segment(messages=[], tools=None, prompt_length=len(ids), tokens=list(ids))
        if termination == AGENT_DONE:
            termination, error = AGENT_ERROR, "the agent returned without calling the model"
    elif (session.out_of_room and termination != AGENT_TIMEOUT) or (termination == AGENT_DONE
                                                                     and segment.finish == "length"):
        termination = TOKEN_BUDGET
    fill(sample, segment, STATUS[termination])
    prior = session.segments[:-1] if ctx.train_segments else []
    failed = sample.status == Sample.Status.FAILED  # the episode failed: none of its segments trains
    sample.prior_segments = [fill(Sample(index=sample.index, group_index=sample.group_index), seg,
                                  Sample.Status.FAILED if failed else STATUS[_ended(seg)]) for seg in prior]
    sample.response = ctx.tokenizer.decode(segment.tokens[segment.prompt_length:],
                                           skip_special_tokens=ctx.skip_special_tokens)
    trained_calls = sum(seg.calls for seg in prior) + segment.calls if session.segments else 0
    sample.metadata.update(turns=session.calls, termination=termination, tool_calls=session.tool_calls,
                           turn_rewards=[], agent_segments=len(session.segments),
                           agent_untrained_calls=session.calls - trained_calls)
    if error is not None:
        sample.metadata["agent_error"] = error
    if result is not None:
        sample.metadata["agent_return"] = json.loads(json.dumps(result, default=lambda o: repr(o)[:200]))
    if session.trajectory is not None:
        sample.metadata["trajectory"] = session.trajectory
    return sample


def _ended(segment: Segment) -> str:
    """How a prior segment's last call ended: cut by its length, or the agent went on."""
    return TOKEN_BUDGET if segment.finish == "length" else AGENT_DONE


def fill(sample: Sample, segment: Segment, status: Sample.Status) -> Sample:
    """`sample`'s tokens, masks, log-probs and versions from one segment; a failed one trains on nothing."""
    sample.tokens = list(segment.tokens)
    sample.response_length = len(segment.tokens) - segment.prompt_length
    sample.loss_mask = list(segment.loss_mask) if status != Sample.Status.FAILED else [0] * sample.response_length
    sample.rollout_log_probs = list(segment.log_probs)
    sample.weight_versions = list(segment.weight_versions)
    sample.status = status
    return sample
