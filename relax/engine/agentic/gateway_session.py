"""One agent episode's model calls, recorded token-in/token-out (docs/agents.md "Recording").

A `Session` holds the episode's segments; each call of the agent goes, one at a time, through
`Session.complete`:

    the request's messages extend the last segment's conversation (its messages + the assistant
    message the gateway returned, compared in canonical form, gateway_protocol.py) with the same tools
        -> prompt ids = the segment's tokens (its first prompt, the engine's completion ids and the
           ids between them, exactly as they were) + the new messages' ids: the chat template's own
           turn delimiters rendered after a sentinel assistant turn (ObservationEncoder.messages_text);
           the engine's closing token (<|im_end|>) stands for the start of that text, as in the
           built-in rollout
    otherwise (the first call, a rewritten history, other tools)
        -> a new segment: the whole conversation rendered by the chat template and tokenized
    /generate(input_ids = prompt ids, return_logprob) -> the engine's output ids and log-probs appended
       as they are (loss mask 1); the new messages' ids before them with loss mask 0, log-prob 0; the
       reply's weight version appended per request

Nothing the engine produced is decoded and re-encoded inside a segment: a segment's tokens are its
first prompt, then for every call the new messages' ids and the engine's ids. The completion is
decoded only for the agent's reply. A call the engine aborts (a weight push, partial rollout)
continues from its tokens so far, up to `MAX_ABORTS` times. Sampling: the run's parameters for the
sample (call k with the sample's seed moved k steps, as the built-in rollout's turns), the
request's `temperature`, `top_p`, `stop`, `seed`, ... over them, and `max_tokens` bounded by
`--rollout-max-response-len` and the context (`--rollout-max-context-len`): a conversation that
leaves no room for a reply is a 400 and the episode ends `token_budget`.
"""

from __future__ import annotations

import asyncio
import secrets
import uuid
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from jinja2 import TemplateError

from relax.engine.agentic.gateway_protocol import ChatCall, GatewayError, Reply
from relax.engine.agentic.observation import ObservationEncoder
from relax.engine.agentic.rollout import turn_params
from relax.engine.rollout.generator import parse_weight_version
from relax.utils.data.formatting import render_chat_template
from relax.utils.http_utils import HTTPError, post

MAX_ABORTS = 16  # an aborted call is continued this many times at most


@dataclass(eq=False)
class RunContext:
    """What every session needs from the run: the tokenizer and template, the router, the limits."""

    tokenizer: Any
    url: str  # the router's /generate
    http_timeout: float
    max_context_len: int | None
    observations: ObservationEncoder
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    model_name: str = "relax-policy"
    log_trajectory: bool = False
    tools_in_prompt: bool = True  # False: a request's tools are declared (parsed), not rendered

    def tools(self, call: ChatCall) -> list[dict[str, Any]] | None:
        return call.tools if self.tools_in_prompt else None

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)


@dataclass(eq=False)
class Segment:
    """A chain of calls whose prompts extend each other: one training sample's worth of tokens."""

    messages: list[dict[str, Any]]  # the last call's messages + the assistant message returned
    tools: list[dict[str, Any]] | None
    prompt_length: int
    tokens: list[int]
    loss_mask: list[int] = field(default_factory=list)  # per response token (after the first prompt)
    log_probs: list[float] = field(default_factory=list)
    weight_versions: list[int] = field(default_factory=list)
    calls: int = 0
    finish: str = "stop"  # the last call's finish type

    def extended_by(self, call: ChatCall) -> bool:
        n = len(self.messages)
        return call.tools == self.tools and len(call.messages) > n and call.messages[:n] == self.messages


@dataclass(eq=False)
class Session:
    """One episode: its key, its sampling parameters and the segments its calls recorded."""

    ctx: RunContext
    params: dict[str, Any]  # the sample's sampling params (seeded; max_new_tokens the run's budget)
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    key: str = field(default_factory=lambda: secrets.token_urlsafe(32), repr=False)
    segments: list[Segment] = field(default_factory=list)
    calls: int = 0
    tool_calls: int = 0
    out_of_room: bool = False  # a call found no room for a reply in the context
    closed: bool = False
    trajectory: list[dict[str, Any]] | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def authorize(self, header: str | None) -> None:
        """`Authorization: Bearer <this session's key>`, or GatewayError 401."""
        scheme, _, given = (header or "").partition(" ")
        if scheme.lower() != "bearer" or not given.strip():
            raise GatewayError(401, "missing credentials: send Authorization: Bearer <the session's key>")
        if not secrets.compare_digest(given.strip().encode(), self.key.encode()):
            raise GatewayError(401, "wrong key for this session")

    async def complete(self, call: ChatCall) -> Reply:
        """Serve one call (module doc); calls of a session run one at a time."""
        async with self.lock:
            self._check_open()
            segment, new_ids = self._prompt(call)
            prompt = (segment.tokens if segment is not None else []) + new_ids
            ids, log_probs, versions, finish = await self._generate(prompt, self._sampling(call, len(prompt)))
            self._check_open()  # the episode ended (its time limit) while the engine answered
            text = self.ctx.tokenizer.decode(ids, skip_special_tokens=True)
            reply = Reply.of(text, call.parse_tools, finish, len(prompt), len(ids), self.ctx.model_name)
            added = call.messages[len(segment.messages):] if segment is not None else call.messages
            self._record(segment, new_ids, call, reply, ids, log_probs, versions, finish)
            self._log(added, new_ids, text, len(ids), finish)
            return reply

    def _check_open(self) -> None:
        if self.closed:
            raise GatewayError(404, f"session {self.id} is closed (its episode ended)")

    def _prompt(self, call: ChatCall) -> tuple[Segment | None, list[int]]:
        """(the segment the call extends, the new messages' ids), or (None, the whole conversation's ids)."""
        if not self.ctx.observations.templated:
            raise GatewayError(500, "the model's tokenizer has no chat template: the gateway cannot render messages")
        last = self.segments[-1] if self.segments else None
        try:
            if last is not None and last.extended_by(call):
                new = call.messages[len(last.messages):]
                end = last.tokens[-1] if len(last.tokens) > last.prompt_length else None
                return last, self.ctx.encode(self.ctx.observations.messages_text(new, end, self.ctx.tools(call)))
            text = render_chat_template(call.messages, self.ctx.tokenizer, tools=self.ctx.tools(call),
                                        kwargs=self.ctx.template_kwargs)
        except (TemplateError, ValueError, TypeError) as exc:
            raise GatewayError(400, f"messages: the chat template cannot render them ({exc})", "messages") from exc
        return None, self.ctx.encode(text)

    def _sampling(self, call: ChatCall, prompt_length: int) -> dict[str, Any]:
        """This call's sampling params (module doc); GatewayError 400 when no reply fits the context."""
        params = turn_params(self.params, 0, self.calls)
        params.update(call.sampling)
        budgets = [b for b in (self.params.get("max_new_tokens"), call.max_tokens) if b is not None]
        limit = self.ctx.max_context_len
        if limit is not None:
            if prompt_length >= limit:
                self.out_of_room = True
                raise GatewayError(400, f"messages: the conversation is {prompt_length} tokens and the context holds "
                                   f"{limit}: no room for a reply", "messages")
            budgets.append(limit - prompt_length)
        if budgets:
            params["max_new_tokens"] = min(int(b) for b in budgets)
        return params

    async def _generate(self, prompt: list[int], params: dict[str, Any]
                        ) -> tuple[list[int], list[float], list[int], str]:
        """(output ids, their log-probs, weight versions, finish type) of one call, an aborted request
        continued from its tokens so far."""
        ids: list[int] = []
        log_probs: list[float] = []
        versions: list[int] = []
        budget = params.get("max_new_tokens")
        for _ in range(MAX_ABORTS + 1):
            request = dict(params) if budget is None else dict(params, max_new_tokens=int(budget) - len(ids))
            if request.get("max_new_tokens") is not None and request["max_new_tokens"] <= 0:
                return ids, log_probs, versions, "length"
            out = await self._post({"input_ids": prompt + ids, "sampling_params": request, "return_logprob": True})
            meta = out["meta_info"]
            pairs = meta.get("output_token_logprobs") or []
            ids += [int(tok) for _, tok, *_ in pairs]
            log_probs += [float(lp) for lp, *_ in pairs]
            if "weight_version" in meta:
                versions.append(parse_weight_version(meta["weight_version"]))
            finish = (meta.get("finish_reason") or {}).get("type", "stop")
            if finish != "abort":
                return ids, log_probs, versions, finish
        raise GatewayError(503, f"the engine aborted this call {MAX_ABORTS + 1} times (weight updates); call again")

    async def _post(self, payload: dict[str, Any]) -> dict[str, Any]:
        try:
            return await post(self.ctx.url, payload, timeout=self.ctx.http_timeout)
        except HTTPError as exc:  # the engine judged the request (a sampling value it refuses) or failed
            raise GatewayError(400 if exc.status == 400 else 502, f"the engine: {exc}") from exc
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            raise GatewayError(502, f"the engine did not answer: {type(exc).__name__}: {exc}") from exc

    def _record(self, segment: Segment | None, new_ids: list[int], call: ChatCall, reply: Reply, ids: list[int],
                log_probs: list[float], versions: list[int], finish: str) -> Segment:
        """The call's ids into its segment (a new one when it extends none)."""
        if segment is None:
            segment = Segment(messages=[], tools=call.tools, prompt_length=len(new_ids), tokens=list(new_ids))
            self.segments.append(segment)
        else:
            segment.tokens += new_ids
            segment.loss_mask += [0] * len(new_ids)
            segment.log_probs += [0.0] * len(new_ids)
        segment.tokens += ids
        segment.loss_mask += [1] * len(ids)
        segment.log_probs += log_probs
        segment.weight_versions += versions
        segment.messages = [*call.messages, reply.canonical()]
        segment.calls += 1
        segment.finish = finish
        self.calls += 1
        self.tool_calls += len(reply.tool_calls)
        return segment

    def _log(self, added: list[dict[str, Any]], new_ids: list[int], text: str, tokens: int, finish: str) -> None:
        """The call in the trajectory (--log-multi-turn): the messages it added, then the model's turn."""
        if not self.ctx.log_trajectory:
            return
        if self.trajectory is None:
            self.trajectory = []
        self.trajectory += [{"role": m["role"], "text": m["content"]} for m in added]
        if added:
            self.trajectory[-1]["tokens"] = len(new_ids)
        self.trajectory.append({"role": "assistant", "text": text, "tokens": tokens, "finish": finish,
                                "segment": len(self.segments) - 1})
