"""The default rollout: generate prompt groups through the router, then score them.

`Generator(spec, ...)` is what `--rollout-function-path`'s default
(`relax.engine.rollout.sglang_rollout.generate_rollout`) runs: `rollout(step, rollout_id,
data_source)` takes `spec.batch_size` prompt groups from the data source, generates every
sample concurrently (the engines batch them), scores them and returns the groups. Everything it
needs is explicit: the `RolloutSpec` (sizes, sampling, seeds, filters, partial rollout), the
tokenizer, the router URL, the reward executor, and per call a `StepState` (progress, filter and
partial-rollout counts, the fully-async group sink). User plugins (custom generate functions,
dynamic-sampling filters) are called with the seed's signatures and the run's plugin `args`.

The default per-sample generate speaks SGLang's `/generate` protocol, so it runs unchanged
against SGLang or the `hf` engine. With an environment (`--rollout-interaction-env-path`) and no
custom generate function, the built-in multi-turn rollout generates instead
(`relax.engine.agentic`), and step rewards join the score by `--turn-reward`; with
`--agent-function-path`, a black-box agent's episode through the agent gateway does (the caller
hands those in: `Generator(..., episodes=relax.engine.agentic.episode_generate)`). With
`--partial-rollout`, a sample a weight update aborted is resubmitted until it completes,
continuing from its partial response (`partial_rollout.py`). With --use-rollout-routing-replay
every request also asks for the routed experts of what it adds to the sample (`routing.py`).
"""

from __future__ import annotations

import asyncio
import copy
import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

from relax.engine.agentic.records import add_turn_rewards
from relax.engine.filters.dynamic_sampling_filters import as_filter_output
from relax.engine.rollout.partial_rollout import is_resuming, resume_request, resume_until_done
from relax.engine.rollout.prompt_encoding import PromptEncoder
from relax.engine.rollout.routing import batch_fields, keep_routing, request_fields
from relax.engine.specs import RolloutSpec
from relax.types import FINISH_REASON_STATUS, Sample
from relax.utils.http_utils import post
from relax.utils.plugins import accepts_keyword, call_maybe_async, load_plugin

logger = logging.getLogger(__name__)

# Seeds are derived per sample, so a sample's tokens depend only on (seed, prompt, weights),
# not on batching or scheduling: reruns reproduce, and async equals sync at staleness 0.
_SEED_MODULUS = 2**31 - 1
MAX_SAMPLING_ROUNDS = 32
GENERATE_SIGNATURE = "generate(args, sample, sampling_params[, evaluation])"


@dataclass(eq=False)
class StepState:
    """One rollout call's bookkeeping, passed to every generate call of that call.

    `group_sink`: `await group_sink(group)` runs as soon as a kept group is final (fully async:
    downstream roles start on it while the step generates). `prompts_drawn`: set once the rollout
    will not touch the data source again for this step; the Rollout then snapshots the data
    position and may start the next step while this one's slowest samples finish."""

    done: int = 0
    total: int = 0
    filter_stats: Counter = field(default_factory=Counter)
    partial_stats: Counter = field(default_factory=Counter)  # aborts resumed (partial_rollout.STAT_KEYS)
    group_sink: Any = None
    prompts_drawn: asyncio.Event = field(default_factory=asyncio.Event)


# ---- one /generate reply -------------------------------------------------------------------

def parse_weight_version(value: Any) -> int:
    """Engine weight versions are strings; SGLang reports "default" before the first update,
    which is version 0 (the checkpoint the engine started from)."""
    text = str(value)
    return int(text) if text.lstrip("-").isdigit() else 0


def fit_to_context(params: dict[str, Any], prompt_len: int, context_len: int | None) -> dict[str, Any] | None:
    """`params` with `max_new_tokens` cut so prompt + response <= `context_len`; None when the
    prompt alone fills the context (nothing may be generated)."""
    if context_len is None:
        return params
    room = context_len - prompt_len
    if room <= 0:
        return None
    wanted = params.get("max_new_tokens")
    return dict(params, max_new_tokens=room if wanted is None else min(int(wanted), room))


def no_room(sample: Sample, prompt_ids: list[int]) -> Sample:
    """A prompt that leaves no room for a response: an empty, truncated response (as slime does)."""
    sample.tokens, sample.response, sample.response_length = list(prompt_ids), "", 0
    sample.loss_mask, sample.rollout_log_probs = [], []
    sample.status = Sample.Status.TRUNCATED
    return sample


def out_of_budget(sample: Sample, prompt_ids: list[int]) -> Sample:
    """Nothing may be generated: a fresh sample gets an empty response (`no_room`); a resumed
    one keeps its partial response and ends truncated (its budget or the context is used up)."""
    if is_resuming(sample):
        sample.status = Sample.Status.TRUNCATED
        return sample
    return no_room(sample, prompt_ids)


def sample_seed(seed: int, sample: Sample, *, evaluation: bool) -> int:
    base = seed * 1_000_003 + (7919 if evaluation else 0)
    return (base + (sample.index or 0) * 104_729 + (sample.abort_count or 0)) % _SEED_MODULUS


def apply_output(sample: Sample, prompt_ids: list[int], out: dict[str, Any]) -> Sample:
    """Fill a sample from one SGLang /generate reply (tokens, response, log-probs, status, version).

    A sample resumed after an abort (partial rollout) keeps what it had: the reply's tokens,
    log-probs and loss-mask entries are appended to its response, its version to the others."""
    meta = out["meta_info"]
    pairs = meta.get("output_token_logprobs") or []
    response_ids = [int(tok) for _, tok, *_ in pairs]
    if not is_resuming(sample):  # a fresh request: the response starts here
        sample.tokens, sample.response, sample.response_length = list(prompt_ids), "", 0
        sample.loss_mask, sample.rollout_log_probs = [], []
    sample.tokens = list(sample.tokens) + response_ids
    sample.response_length += len(response_ids)
    sample.response += out.get("text", "")
    sample.loss_mask = list(sample.loss_mask or []) + [1] * len(response_ids)
    sample.rollout_log_probs = list(sample.rollout_log_probs or []) + [float(lp) for lp, *_ in pairs]
    if "weight_version" in meta:
        sample.weight_versions.append(parse_weight_version(meta["weight_version"]))
    finish = (meta.get("finish_reason") or {}).get("type", "stop")
    sample.status = FINISH_REASON_STATUS.get(finish, Sample.Status.COMPLETED)
    return sample


def _same_prompt(group: list[Sample]) -> bool:
    return all(s.prompt == group[0].prompt and not s.tokens for s in group)


# ---- the generator -------------------------------------------------------------------------

class Generator:
    def __init__(self, spec: RolloutSpec, *, tokenizer: Any, router_url: str, rewards: Any, plugin_args: Any,
                 processor: Any = None, pipelines: dict[str, Any] | None = None, encoder: Any = None,
                 episodes: Callable[[Generator], Any] | None = None) -> None:
        """`rewards`: a `RewardExecutor`; `plugin_args`: the namespace user plugins are called with;
        `processor`: a VL/Omni model's `MultimodalProcessor` and `pipelines` the media flags' resize /
        resample (multimodal runs); `encoder`: how prompts are encoded off the event loop
        (`prompt_encoding.PromptEncoder`; default: threads); `episodes`: given this generator, the
        generate function of its multi-turn or agent episodes, or None for single turns (the caller
        passes `relax.engine.agentic.episode_generate`; this layer does not name the one above it)."""
        self.spec, self.tokenizer, self.router_url = spec, tokenizer, router_url
        self.processor, self.pipelines = processor, pipelines
        self.encoder = encoder or PromptEncoder(tokenizer, processor, pipelines)
        self.rewards, self.args, self.episodes = rewards, plugin_args, episodes
        self.custom_generate = load_plugin(spec.custom_generate_path, flag="--custom-generate-function-path",
                                           positional=3, expected=GENERATE_SIGNATURE) \
            if spec.custom_generate_path else episodes(self) if episodes is not None else None
        self.dynamic_filter = load_plugin(spec.dynamic_filter_path, flag="--dynamic-sampling-filter-path",
                                          positional=2, expected="filter(args, samples, **kwargs) -> bool | "
                                          "DynamicFilterOutput") if spec.dynamic_filter_path else None

    def derive(self, spec: RolloutSpec, rewards: Any = None, plugin_args: Any = None) -> Generator:
        """A generator for other settings (an eval dataset) on the same tokenizer and router."""
        return Generator(spec, tokenizer=self.tokenizer, router_url=self.router_url, rewards=rewards or self.rewards,
                         plugin_args=plugin_args if plugin_args is not None else self.args, processor=self.processor,
                         pipelines=self.pipelines, encoder=self.encoder, episodes=self.episodes)

    # ---- one sample ----------------------------------------------------------------------
    def _seeded(self, sample: Sample, params: dict[str, Any]) -> dict[str, Any]:
        return dict(params, sampling_seed=sample_seed(self.spec.seed, sample, evaluation=self.spec.evaluation))

    async def generate(self, sample: Sample, params: dict[str, Any]) -> Sample:
        """Default single-turn generate: prompt -> one response, with per-token log-probs; the
        response is cut to fit the context limit. An aborted sample (partial rollout) continues
        from its partial response with the budget it has left."""
        ids, media = await self.encoder.encode(sample)
        resuming = is_resuming(sample)
        if not resuming:  # a fresh response: a fresh routing record (R3)
            sample.rollout_routed_experts = None
        input_ids, params = resume_request(sample, ids, params)
        if params is not None:
            params = fit_to_context(params, len(input_ids), self.spec.sampling.max_context_len)
        if params is None:
            return out_of_budget(sample, ids)
        routing = request_fields(sample, self.spec.routing, len(input_ids))
        payload = {"input_ids": input_ids, "sampling_params": params, "return_logprob": True, **media, **routing}
        out = await post(self.router_url, payload, timeout=self.spec.http_timeout)
        sample = apply_output(sample, ids, out)
        keep_routing(sample, out["meta_info"], routing.get("routed_experts_start_len", 0), self.spec.routing)
        if resuming:  # decoded whole: segment texts may split a multi-byte character
            sample.response = self.tokenizer.decode(sample.tokens[len(sample.tokens) - sample.response_length:],
                                                    skip_special_tokens=self.spec.sampling.skip_special_tokens)
        return sample

    async def generate_one(self, step: StepState, sample: Sample) -> Sample:
        """Generate with the default or the custom generate function (scored by the caller).

        With `--partial-rollout` an aborted sample is handed back to the same function until it
        completes; a custom generate function sees `sample.status == ABORTED` with the partial
        response in `sample.tokens` / `loss_mask` / `rollout_log_probs` and should continue it."""
        params, custom = self.spec.sampling.params(), self.custom_generate

        async def attempt(s: Sample) -> Sample:
            seeded = self._seeded(s, params)
            if custom is None:
                return await self.generate(s, seeded)
            if accepts_keyword(custom, "evaluation"):
                return await call_maybe_async(custom, self.args, s, seeded, evaluation=self.spec.evaluation)
            return await call_maybe_async(custom, self.args, s, seeded)

        result = await resume_until_done(await attempt(sample), attempt, self.spec.partial, step.partial_stats)
        if result.prior_segments and not self.spec.agentic.train_segments:  # --agent-segments last (or auto's)
            result.prior_segments = []
        step.done += 1
        return result

    # ---- one group -----------------------------------------------------------------------
    async def _generate_batched(self, step: StepState, group: list[Sample]) -> list[Sample]:
        """The whole group as ONE batched /generate request (same prompt, a seed per sample).

        SGLang's batch form (`input_ids` as a list of lists, `sampling_params` as a list) returns
        one reply per item; n times fewer HTTP round trips than one request per sample. Samples a
        weight update aborted (partial rollout) are then resumed one by one."""
        ids, media = await self.encoder.encode(group[0])
        for s in group[1:]:  # same prompt, same media: the same encoder tensors
            s.multimodal_train_inputs = group[0].multimodal_train_inputs
        train_params = self.spec.sampling.params()
        base = fit_to_context(train_params, len(ids), self.spec.sampling.max_context_len)
        if base is None:
            step.done += len(group)
            return [no_room(s, ids) for s in group]
        payload = {"input_ids": [ids] * len(group), "sampling_params": [self._seeded(s, base) for s in group],
                   "return_logprob": True, **{k: [v] * len(group) for k, v in media.items()},
                   **batch_fields(self.spec.routing)}
        outs = await post(self.router_url, payload, timeout=self.spec.http_timeout)
        group = [apply_output(s, list(ids), out) for s, out in zip(group, outs)]
        for s, out in zip(group, outs):  # R3: fresh samples, records from position 0
            s.rollout_routed_experts = None
            keep_routing(s, out["meta_info"], 0, self.spec.routing)

        async def resume(s: Sample) -> Sample:
            return await self.generate(s, self._seeded(s, train_params))

        group = list(await asyncio.gather(*(resume_until_done(s, resume, self.spec.partial, step.partial_stats)
                                            for s in group)))
        step.done += len(group)
        return group

    async def generate_group(self, step: StepState, group: list[Sample]) -> list[Sample]:
        """Generate every sample of a group (batched when the default generate applies), then score."""
        if self.custom_generate is None and len(group) > 1 and _same_prompt(group):
            group = await self._generate_batched(step, group)
        else:
            group = list(await asyncio.gather(*(self.generate_one(step, s) for s in group)))
        await self.rewards.score(group)
        add_turn_rewards(group, self.spec.agentic.turn_reward, getattr(self.rewards, "reward_key", None))
        return group

    def keep_group(self, step: StepState, group: list[Sample]) -> bool:
        if self.dynamic_filter is None:
            return True
        verdict = as_filter_output(self.dynamic_filter(self.args, group))
        if not verdict.keep:
            step.filter_stats["rollout/filter_dropped_groups"] += 1
            step.filter_stats[f"rollout/filter_drop/{verdict.reason or 'filtered'}"] += 1
        return verdict.keep

    # ---- one rollout step ----------------------------------------------------------------
    async def rollout(self, step: StepState, rollout_id: int, data_source: Any) -> list[list[Sample]]:
        """`batch_size` groups, generated and scored.

        With a dynamic-sampling filter, prompts are drawn `over_sampling_batch_size` groups at a
        time and generated concurrently; groups the filter rejects are dropped (and counted),
        until enough groups are kept. Kept groups beyond the target go back to the data source
        as prompts (their responses are discarded, so nothing stale is ever trained on). Without
        a filter, an over-sampling batch above the rollout batch still draws that many groups per
        round (the engines stay busy); the first `batch_size` in prompt order are kept. With
        partial rollout every drawn group is generated to completion, so a kept group is whole."""
        target = self.spec.batch_size
        chunk = self.spec.over_sampling_batch_size or target
        step.done, step.total = 0, target * self.spec.n_samples_per_prompt
        # One round that keeps every group never returns prompts to the data source: it is free
        # for the next step as soon as this round is drawn.
        single_round = self.dynamic_filter is None and chunk == target
        try:
            return await self._sampling_rounds(step, rollout_id, data_source, chunk, single_round)
        finally:
            step.prompts_drawn.set()

    async def _sampling_rounds(self, step: StepState, rollout_id: int, data_source: Any, chunk: int,
                               single_round: bool) -> list[list[Sample]]:
        target = self.spec.batch_size
        kept: list[list[Sample]] = []
        for _ in range(MAX_SAMPLING_ROUNDS):
            prompts = data_source.get_samples(chunk)
            if single_round:
                step.prompts_drawn.set()
            # Surplus groups go back as these untouched prompts: never with responses (or partial ones).
            originals = copy.deepcopy(prompts) if self.dynamic_filter or chunk > target else []
            tasks = [asyncio.ensure_future(self.generate_group(step, g)) for g in prompts]
            step.filter_stats["rollout/sampling_rounds"] += 1
            surplus = []
            # Decided in prompt order (not completion order), so which groups are kept never depends
            # on timing; each kept group is handed to the sink as soon as it and those before it are done.
            for i, task in enumerate(tasks):
                group = await task
                if not self.keep_group(step, group):
                    continue
                if len(kept) < target:
                    kept.append(group)
                    if step.group_sink is not None:
                        await step.group_sink(group)
                else:
                    surplus.append(originals[i])
            if surplus:
                data_source.add_samples(surplus)
            if len(kept) >= target:
                return kept
        raise RuntimeError(f"rollout {rollout_id}: dynamic sampling kept {len(kept)} of {target} groups after "
                           f"{MAX_SAMPLING_ROUNDS} rounds of {chunk}; the filter ({self.spec.dynamic_filter_path}) "
                           "rejects almost everything — check the reward, or raise --over-sampling-batch-size")
