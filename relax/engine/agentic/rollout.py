"""The built-in multi-turn rollout as a generate function (the seeds' signature).

- `generate(args, sample, sampling_params, evaluation=False)`: usable as
  `--custom-generate-function-path relax.engine.agentic.generate`; the environment module is
  `--rollout-interaction-env-path` (flag or `--custom-config-path` YAML key).
- With `--rollout-interaction-env-path` and no custom generate function, the rollout runs it by
  default (`Generator` takes `default_generate`), for training and eval alike.
- `multi_turn_generate(..., env_path=DEFAULT_ENV_MODULE)`: what the seeds' copied `rollout.py`
  calls (the migration guide's "Migrate rollout" step); the configured path wins over the default.

`EpisodeContext` is everything one episode needs from the run (tokenizer, prompt encoder, media
processor, router, limits, the `AgenticSpec`) and the three operations the episode loop
(episode.py) delegates: one model turn (token-in/token-out: the engine's output ids and log-probs
appended as they are), the observation ids (observation.py), and the finish (status, response
text, metadata, the true on-policy rescoring).

True on-policy (`--true-on-policy-mode`): the engine reports each request's log-probs from a row
that ends at that request, but the trainer scores the whole trajectory as one row, and a prefix
scored inside a longer row is not bitwise the prefix scored alone. So a sample that took more
than one request is scored once more when it is finished: `max_new_tokens: 0`,
`logprob_start_len` at the response, and every response token's log-prob (model turns and
observations) is replaced by the engine's input-token log-prob of that one full row, which the
engine computes with the trainer's function and temperature (docs/true-on-policy.md). Skipped (the
turns' log-probs kept, `metadata["rescored"] = False`) when the turns saw different weight
versions or a push landed before the rescoring: those log-probs are the behaviour policy's.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any, Callable

from relax.engine.agentic import episode as episodes
from relax.engine.agentic.episode import STATUS, Episode
from relax.engine.agentic.observation import ObservationEncoder
from relax.engine.agentic.tool_calls import tool_call_tag
from relax.engine.rollout.routing import keep_routing, request_fields
from relax.engine.rollout.sglang_rollout import bound_generator, parse_weight_version
from relax.engine.specs import AgenticSpec
from relax.types import Sample
from relax.utils.http_utils import post
from relax.utils.routing import RoutingShape

logger = logging.getLogger(__name__)

_SEED_MODULUS = 2**31 - 1


@dataclass(eq=False)
class EpisodeContext:
    spec: AgenticSpec
    env_path: str
    args: Any  # the plugin args build_env gets
    tokenizer: Any
    encoder: Any  # relax.engine.rollout.prompt_encoding.PromptEncoder
    processor: Any  # MultimodalProcessor (None in a text run)
    pipelines: dict[str, Any] | None
    url: str  # the router's /generate
    http_timeout: float
    max_context_len: int | None
    skip_special_tokens: bool
    observations: ObservationEncoder
    routing: RoutingShape | None = None  # R3: each turn asks for the routed experts of what it adds

    @classmethod
    def of(cls, generator: Any, args: Any, env_path: str | None = None) -> EpisodeContext:
        spec: AgenticSpec = generator.spec.agentic
        path = spec.env_path or env_path
        if not path:
            raise RuntimeError("the multi-turn rollout needs an environment: set --rollout-interaction-env-path (flag "
                               "or --custom-config-path YAML key rollout_interaction_env_path), or pass env_path= to "
                               "multi_turn_generate (docs/agentic.md)")
        sampling = generator.spec.sampling
        return cls(spec=spec, env_path=path, args=args, tokenizer=generator.tokenizer, encoder=generator.encoder,
                   processor=generator.processor, pipelines=generator.pipelines, url=generator.router_url,
                   http_timeout=generator.spec.http_timeout, max_context_len=sampling.max_context_len,
                   skip_special_tokens=sampling.skip_special_tokens,
                   observations=ObservationEncoder(generator.tokenizer, dict(spec.template_kwargs)),
                   routing=generator.spec.routing)

    # ---- what the episode loop calls ---------------------------------------------------
    def media_context(self, sample: Sample) -> Any:
        if self.processor is None:
            return None
        from relax.utils.multimodal.turns import MediaContext

        return MediaContext(self.processor, sample, self.pipelines)

    def decode(self, ids: list[int]) -> str:
        """A model turn's text, for the environment only (never encoded again)."""
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def fits(self, sample: Sample, more: int) -> bool:
        """`more` tokens still fit the context and --multi-turn-max-tokens."""
        return all(room is None or room >= more for room in self._rooms(sample))

    def _rooms(self, sample: Sample) -> tuple[int | None, int | None]:
        context = None if self.max_context_len is None else self.max_context_len - len(sample.tokens)
        budget = None if self.spec.max_tokens is None else self.spec.max_tokens - sample.response_length
        return context, budget

    def observation_ids(self, message: dict[str, Any], last_token: int | None, media: Any
                        ) -> tuple[list[int], str, dict[str, list[Any]]]:
        return self.observations.ids(message, last_token, media)

    async def model_turn(self, episode: Episode, sample: Sample, params: dict[str, Any]) -> str:
        """One /generate for the current turn (continuing an aborted one); the engine's ids and
        log-probs appended as they are. Returns the finish type ("stop", "length", "abort"), or
        "no_room" when nothing may be generated."""
        if not episode.open_turn:
            episode.turn_start, episode.open_turn = len(sample.tokens), True
        generated = len(sample.tokens) - episode.turn_start
        turn = turn_params(params, generated, episode.turns)
        rooms = [r for r in (turn.get("max_new_tokens"), *self._rooms(sample)) if r is not None]
        if rooms and min(rooms) <= 0:
            return "length" if generated else "no_room"
        if rooms:
            turn["max_new_tokens"] = min(rooms)
        if self.spec.constrain_tool_calls:  # the turn's tool calls parse (tool_calls.tool_call_tag)
            turn["structural_tag"] = tool_call_tag(sample.metadata.get("tools"))
        media = episode.media.request() if episode.media is not None else {}
        # R3: the turn's input is the trajectory so far; the engine reports the routing of what the
        # record lacks (the previous turn's last token, the observation) and of this turn's tokens
        routing = request_fields(sample, self.routing, len(sample.tokens))
        out = await post(self.url, {"input_ids": list(sample.tokens), "sampling_params": turn,
                                    "return_logprob": True, **media, **routing}, timeout=self.http_timeout)
        episode.requests += 1
        keep_routing(sample, out["meta_info"], routing.get("routed_experts_start_len", 0), self.routing)
        return append_turn(sample, out)

    async def finish(self, sample: Sample, episode: Episode, termination: str, params: dict[str, Any]) -> Sample:
        """Status, response text and metadata; the true on-policy rescoring (module doc)."""
        sample.status = STATUS[termination]
        if sample.status == Sample.Status.FAILED:
            sample.loss_mask = [0] * len(sample.loss_mask or [])
        sample.response = self.tokenizer.decode(sample.tokens[episode.prompt_length:],
                                                skip_special_tokens=self.skip_special_tokens)
        sample.metadata.update(turns=episode.turns, termination=termination, tool_calls=episode.tool_calls,
                               turn_rewards=list(episode.turn_rewards))
        if episode.trajectory is not None:
            sample.metadata["trajectory"] = episode.trajectory
        if self.spec.true_on_policy and episode.requests > 1 and sample.response_length:
            sample.metadata["rescored"] = await self.rescore(sample, episode, params)
        return sample

    async def rescore(self, sample: Sample, episode: Episode, params: dict[str, Any]) -> bool:
        """The whole trajectory's response log-probs from one engine row (module doc)."""
        versions = set(sample.weight_versions)
        if len(versions) > 1:
            return False
        media = episode.media.request() if episode.media is not None else {}
        out = await post(self.url, {
            "input_ids": list(sample.tokens), "return_logprob": True, "logprob_start_len": episode.prompt_length,
            "sampling_params": {"temperature": float(params.get("temperature", 1.0)), "max_new_tokens": 0},
            **media}, timeout=self.http_timeout)
        meta = out["meta_info"]
        if (meta.get("finish_reason") or {}).get("type") == "abort" or (
                "weight_version" in meta and parse_weight_version(meta["weight_version"]) not in versions):
            return False
        scores = meta.get("input_token_logprobs") or []
        if len(scores) != sample.response_length:
            logger.warning("sample %s: the rescoring returned %d log-probs for %d response tokens; the turns' "
                           "log-probs are kept", sample.index, len(scores), sample.response_length)
            return False
        sample.rollout_log_probs = [float(lp) for lp, *_ in scores]
        return True


def turn_params(params: dict[str, Any], generated: int, turns: int) -> dict[str, Any]:
    """This turn's sampling params: the per-turn budgets less what the turn has generated (a turn
    resumed after an abort), and a seed of its own (turn k: the sample's seed moved k steps)."""
    turn = dict(params)
    if turn.get("max_new_tokens") is not None:
        turn["max_new_tokens"] = int(turn["max_new_tokens"]) - generated
    if turn.get("min_new_tokens"):
        turn["min_new_tokens"] = max(0, int(turn["min_new_tokens"]) - generated)
    if turn.get("sampling_seed") is not None:
        turn["sampling_seed"] = (int(turn["sampling_seed"]) + 1_000_003 * turns) % _SEED_MODULUS
    return turn


def append_turn(sample: Sample, out: dict[str, Any]) -> str:
    """The reply's output ids and log-probs appended to the sample (loss mask 1); its finish type."""
    meta = out["meta_info"]
    pairs = meta.get("output_token_logprobs") or []
    ids = [int(tok) for _, tok, *_ in pairs]
    sample.tokens = list(sample.tokens) + ids
    sample.response_length += len(ids)
    sample.loss_mask = list(sample.loss_mask or []) + [1] * len(ids)
    sample.rollout_log_probs = list(sample.rollout_log_probs or []) + [float(lp) for lp, *_ in pairs]
    if "weight_version" in meta:
        sample.weight_versions.append(parse_weight_version(meta["weight_version"]))
    finish = (meta.get("finish_reason") or {}).get("type", "stop")
    if finish == "abort":
        sample.status = Sample.Status.ABORTED
    return finish


async def multi_turn_generate(args: Any, sample: Sample, sampling_params: dict[str, Any], evaluation: bool = False,
                              *, env_path: str | None = None, constrain_tool_calls: bool | None = None) -> Sample:
    """The multi-turn rollout of `sample` with the run's generator (`args` as the rollout hands it
    to plugins); `env_path`: the environment module when the run configures none;
    `constrain_tool_calls`: ask the engine to make every turn's tool calls parse (None: the run's
    --multi-turn-constrain-tool-calls)."""
    ctx = EpisodeContext.of(bound_generator(args), args, env_path)
    if constrain_tool_calls is not None:
        ctx.spec = dataclasses.replace(ctx.spec, constrain_tool_calls=constrain_tool_calls)
    return await episodes.run(ctx, sample, sampling_params, evaluation)


async def generate(args: Any, sample: Sample, sampling_params: dict[str, Any], evaluation: bool = False) -> Sample:
    """`--custom-generate-function-path relax.engine.agentic.generate` (module doc)."""
    return await multi_turn_generate(args, sample, sampling_params, evaluation)


def default_generate(generator: Any) -> Callable[..., Any]:
    """The generate function a `Generator` runs when an environment is configured and no custom
    generate function is: the multi-turn rollout on that generator."""
    async def generate(args: Any, sample: Sample, sampling_params: dict[str, Any], evaluation: bool = False) -> Sample:
        return await episodes.run(EpisodeContext.of(generator, args), sample, sampling_params, evaluation)

    return generate
