"""Default rollout: single-turn generation through the router, then rewards.

`generate_rollout(args, rollout_id, data_source, evaluation=False)` is the default
`--rollout-function-path`: it takes `rollout_batch_size` prompt groups from the data source,
generates every sample concurrently (the engines batch them), scores them with the reward
executor and returns the groups. `generate(args, sample, sampling_params)` is the default
per-sample generate function; `--custom-generate-function-path` replaces it with the same
signature (optionally with `evaluation`). Both speak SGLang's `/generate` protocol, so they
run unchanged against SGLang or the `hf` engine. With `--partial-rollout`, a sample a weight
update aborted is resubmitted until it completes, continuing from its partial response
(`partial_rollout.py`).

Each rollout call keeps its bookkeeping (progress, filter and partial-rollout counts, the
fully-async group sink) in a `StepState` held by a context variable: the Rollout role runs each
fully-async step in its own asyncio task, so steps that overlap keep theirs apart.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from collections import Counter
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from relax.engine.filters.dynamic_sampling_filters import as_filter_output
from relax.engine.rollout.partial_rollout import PartialRolloutConfig, is_resuming, resume_request, resume_until_done
from relax.types import FINISH_REASON_STATUS, Sample
from relax.utils.http_utils import post
from relax.utils.plugins import accepts_keyword, call_maybe_async, load_plugin

logger = logging.getLogger(__name__)

# Seeds are derived per sample, so a sample's tokens depend only on (seed, prompt, weights),
# not on batching or scheduling: reruns reproduce, and async equals sync at staleness 0.
_SEED_MODULUS = 2**31 - 1
MAX_SAMPLING_ROUNDS = 32
# The flags that pick how a sample is scored; an eval dataset overriding one gets its own executor.
_EXECUTOR_FLAGS = ("rm_type", "custom_rm_path", "reward_key", "group_rm")


@dataclass(eq=False)
class StepState:
    """One rollout step's bookkeeping, shared by the generate calls of that step.

    `group_sink`: set by the Rollout role in fully-async mode; `await group_sink(group)` runs as
    soon as a kept group is final, so downstream roles start on it while the step generates.
    `prompts_drawn`: set by the rollout function once it will not touch the data source again
    for this step; the Rollout role then snapshots the data position and may start the next
    step while this one's slowest samples finish (a rollout function that never sets it makes
    steps run one after another)."""

    done: int = 0
    total: int = 0
    filter_stats: Counter = field(default_factory=Counter)
    partial_stats: Counter = field(default_factory=Counter)  # aborts resumed (partial_rollout.STAT_KEYS)
    group_sink: Any = None
    prompts_drawn: asyncio.Event = field(default_factory=asyncio.Event)


# The step the current asyncio task works for; None outside a Rollout step task (colocate,
# evaluation, tests), where the process-wide `GenerateState.default_step` applies.
_CURRENT_STEP: ContextVar[StepState | None] = ContextVar("relax_rollout_step", default=None)


def enter_step(step: StepState) -> None:
    """Make `step` the current one for this asyncio task (and the tasks it creates)."""
    _CURRENT_STEP.set(step)


class GenerateState:
    """Per-process rollout state shared by generate functions (tokenizer, reward executor,
    progress counters). `GenerateState(args)` returns the one instance for the process."""

    _instance: GenerateState | None = None

    def __new__(cls, args: Any) -> GenerateState:
        if cls._instance is None:
            inst = super().__new__(cls)
            inst._init(args)
            cls._instance = inst
        return cls._instance

    def _init(self, args: Any) -> None:
        from transformers import AutoTokenizer

        from relax.engine.rewards.executor import RewardExecutor

        self.args = args
        self.tokenizer = AutoTokenizer.from_pretrained(args.hf_checkpoint)
        self.reward_executor = RewardExecutor(args)
        self.custom_generate = None
        if args.custom_generate_function_path:
            self.custom_generate = load_plugin(
                args.custom_generate_function_path, flag="--custom-generate-function-path", positional=3,
                expected="generate(args, sample, sampling_params[, evaluation])")
        self.dynamic_filter = None
        if args.dynamic_sampling_filter_path:
            self.dynamic_filter = load_plugin(
                args.dynamic_sampling_filter_path, flag="--dynamic-sampling-filter-path", positional=2,
                expected="filter(args, samples, **kwargs) -> bool | DynamicFilterOutput")
        self._generate_functions: dict[str, Any] = {}
        self._executors: dict[tuple, Any] = {}
        self.default_step = StepState()

    @property
    def step(self) -> StepState:
        """The current step's bookkeeping (see `StepState`)."""
        return _CURRENT_STEP.get() or self.default_step

    def generate_function(self, args: Any) -> Any:
        """The custom generate function `args` names (the run's, or an eval dataset's), or None."""
        path = args.custom_generate_function_path
        if not path:
            return None
        if path == self.args.custom_generate_function_path:
            return self.custom_generate
        if path not in self._generate_functions:
            self._generate_functions[path] = load_plugin(
                path, flag="custom_generate_function_path", positional=3,
                expected="generate(args, sample, sampling_params[, evaluation])")
        return self._generate_functions[path]

    def executor_for(self, args: Any) -> Any:
        """The reward executor for `args`: the run's, or (an eval dataset with its own rm_type or
        reward key) one made for those settings and kept for the next evaluation."""
        key = tuple(getattr(args, name, None) for name in _EXECUTOR_FLAGS)
        if key == tuple(getattr(self.args, name, None) for name in _EXECUTOR_FLAGS):
            return self.reward_executor
        if key not in self._executors:
            from relax.engine.rewards.executor import RewardExecutor

            self._executors[key] = RewardExecutor(args)
        return self._executors[key]

    @classmethod
    def reset(cls) -> None:
        if cls._instance is not None:
            for executor in [cls._instance.reward_executor, *cls._instance._executors.values()]:
                executor.close()
        cls._instance = None


def sampling_params(args: Any, *, evaluation: bool = False) -> dict[str, Any]:
    """SGLang `sampling_params` from the rollout (or eval) flags."""
    def pick(eval_value: Any, train_value: Any) -> Any:
        return eval_value if evaluation and eval_value is not None else train_value

    params = {
        "temperature": pick(args.eval_temperature, args.rollout_temperature),
        "top_p": pick(args.eval_top_p, args.rollout_top_p),
        "top_k": pick(args.eval_top_k, args.rollout_top_k),
        "max_new_tokens": pick(args.eval_max_response_len, args.rollout_max_response_len),
        "skip_special_tokens": args.rollout_skip_special_tokens,
        "no_stop_trim": True,
    }
    if args.rollout_stop:
        params["stop"] = list(args.rollout_stop)
    if args.rollout_stop_token_ids:
        params["stop_token_ids"] = list(args.rollout_stop_token_ids)
    if evaluation and args.eval_min_new_tokens:
        params["min_new_tokens"] = args.eval_min_new_tokens
    return params


def max_context_len(args: Any, *, evaluation: bool = False) -> int | None:
    """Prompt + response token limit: `--eval-max-context-len` (eval, default the rollout one) or
    `--rollout-max-context-len`; None = the engine's own limit."""
    if evaluation and args.eval_max_context_len is not None:
        return args.eval_max_context_len
    return args.rollout_max_context_len


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


def sample_seed(args: Any, sample: Sample, *, evaluation: bool) -> int:
    base = args.rollout_seed * 1_000_003 + (7919 if evaluation else 0)
    return (base + (sample.index or 0) * 104_729 + (sample.abort_count or 0)) % _SEED_MODULUS


def router_url(args: Any) -> str:
    return f"http://{args.sglang_router_ip}:{args.sglang_router_port}/generate"


def _prompt_ids(state: GenerateState, sample: Sample) -> list[int]:
    if isinstance(sample.prompt, str):
        return state.tokenizer.encode(sample.prompt, add_special_tokens=False)
    text = state.tokenizer.apply_chat_template(sample.prompt, tokenize=False, add_generation_prompt=True)
    return state.tokenizer.encode(text, add_special_tokens=False)


def parse_weight_version(value: Any) -> int:
    """Engine weight versions are strings; SGLang reports "default" before the first update,
    which is version 0 (the checkpoint the engine started from)."""
    text = str(value)
    return int(text) if text.lstrip("-").isdigit() else 0


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


async def generate(args: Any, sample: Sample, sampling_params: dict[str, Any], evaluation: bool = False) -> Sample:
    """Default single-turn generate: prompt -> one response, with per-token log-probs; the
    response is cut to fit the context limit (`max_context_len`). An aborted sample (partial
    rollout) continues from its partial response with the budget it has left."""
    state = GenerateState(args)
    prompt_ids = _prompt_ids(state, sample)
    resuming = is_resuming(sample)
    input_ids, params = resume_request(sample, prompt_ids, sampling_params)
    if params is not None:
        params = fit_to_context(params, len(input_ids), max_context_len(args, evaluation=evaluation))
    if params is None:
        return out_of_budget(sample, prompt_ids)
    payload = {"input_ids": input_ids, "sampling_params": params, "return_logprob": True}
    out = await post(router_url(args), payload, timeout=args.http_timeout)
    sample = apply_output(sample, prompt_ids, out)
    if resuming:  # decoded whole: segment texts may split a multi-byte character
        sample.response = state.tokenizer.decode(sample.tokens[len(sample.tokens) - sample.response_length:],
                                                 skip_special_tokens=args.rollout_skip_special_tokens)
    return sample


def out_of_budget(sample: Sample, prompt_ids: list[int]) -> Sample:
    """Nothing may be generated: a fresh sample gets an empty response (`no_room`); a resumed
    one keeps its partial response and ends truncated (its budget or the context is used up)."""
    if is_resuming(sample):
        sample.status = Sample.Status.TRUNCATED
        return sample
    return no_room(sample, prompt_ids)


def _seeded(args: Any, sample: Sample, params: dict[str, Any], *, evaluation: bool) -> dict[str, Any]:
    return dict(params, sampling_seed=sample_seed(args, sample, evaluation=evaluation))


async def generate_group_default(args: Any, group: list[Sample], *, evaluation: bool = False) -> list[Sample]:
    """The whole group as ONE batched /generate request (same prompt, a seed per sample).

    SGLang's batch form (`input_ids` as a list of lists, `sampling_params` as a list) returns
    one reply per item; n times fewer HTTP round trips than one request per sample. Samples a
    weight update aborted (partial rollout) are then resumed one by one.
    """
    state = GenerateState(args)
    prompt_ids = _prompt_ids(state, group[0])
    train_params = sampling_params(args, evaluation=evaluation)
    base = fit_to_context(train_params, len(prompt_ids), max_context_len(args, evaluation=evaluation))
    if base is None:
        state.step.done += len(group)
        return [no_room(s, prompt_ids) for s in group]
    params = [_seeded(args, s, base, evaluation=evaluation) for s in group]
    payload = {"input_ids": [prompt_ids] * len(group), "sampling_params": params, "return_logprob": True}
    outs = await post(router_url(args), payload, timeout=args.http_timeout)
    group = [apply_output(s, list(prompt_ids), out) for s, out in zip(group, outs)]

    async def resume(s: Sample) -> Sample:
        return await generate(args, s, _seeded(args, s, train_params, evaluation=evaluation), evaluation)

    cfg = PartialRolloutConfig.from_args(args)
    group = list(await asyncio.gather(*(resume_until_done(s, resume, cfg, state.step.partial_stats) for s in group)))
    state.step.done += len(group)
    return group


async def generate_one(args: Any, sample: Sample, *, evaluation: bool = False) -> Sample:
    """Generate with the default or custom function (reward is scored by the caller).

    With `--partial-rollout` an aborted sample is handed back to the same function until it
    completes; a custom generate function sees `sample.status == ABORTED` with the partial
    response in `sample.tokens` / `loss_mask` / `rollout_log_probs` and should continue it."""
    state = GenerateState(args)
    params = sampling_params(args, evaluation=evaluation)
    custom = state.generate_function(args)
    fn = custom or generate

    async def attempt(s: Sample) -> Sample:
        seeded = _seeded(args, s, params, evaluation=evaluation)
        if custom is None or accepts_keyword(fn, "evaluation"):
            return await call_maybe_async(fn, args, s, seeded, evaluation=evaluation)
        return await call_maybe_async(fn, args, s, seeded)

    result = await resume_until_done(await attempt(sample), attempt, PartialRolloutConfig.from_args(args),
                                     state.step.partial_stats)
    state.step.done += 1
    return result


def _same_prompt(group: list[Sample]) -> bool:
    return all(s.prompt == group[0].prompt and not s.tokens for s in group)


async def generate_group(args: Any, group: list[Sample], *, evaluation: bool = False) -> list[Sample]:
    """Generate every sample of a group (batched when the default generate applies), then score."""
    state = GenerateState(args)
    if state.generate_function(args) is None and len(group) > 1 and _same_prompt(group):
        group = await generate_group_default(args, group, evaluation=evaluation)
    else:
        group = list(await asyncio.gather(*(generate_one(args, s, evaluation=evaluation) for s in group)))
    await state.executor_for(args).score(group)
    return group


async def generate_rollout(args: Any, rollout_id: int, data_source: Any, evaluation: bool = False) -> list[list[Sample]]:
    """Default rollout function: `rollout_batch_size` groups, generated and scored.

    With `--dynamic-sampling-filter-path`, prompts are drawn `--over-sampling-batch-size` groups
    at a time and generated concurrently; groups the filter rejects are dropped (and counted),
    until enough groups are kept. Kept groups beyond the target go back to the data source as
    prompts (their responses are discarded, so nothing stale is ever trained on). Without a
    filter, `--over-sampling-batch-size` > `--rollout-batch-size` still draws that many groups
    per round (the engines stay busy); the first `rollout_batch_size` in prompt order are kept.
    With `--partial-rollout` every drawn group is generated to completion (aborted samples are
    resumed), so a kept group is always whole.
    """
    state = GenerateState(args)
    step = state.step
    target = args.rollout_batch_size
    chunk = args.over_sampling_batch_size or target
    step.done, step.total = 0, target * args.n_samples_per_prompt
    # One round that keeps every group never returns prompts to the data source: it is free
    # for the next step as soon as this round is drawn.
    single_round = state.dynamic_filter is None and chunk == target
    try:
        return await _sampling_rounds(args, rollout_id, data_source, chunk, single_round, evaluation)
    finally:
        step.prompts_drawn.set()


async def _sampling_rounds(args: Any, rollout_id: int, data_source: Any, chunk: int, single_round: bool,
                           evaluation: bool) -> list[list[Sample]]:
    state = GenerateState(args)
    step, target = state.step, args.rollout_batch_size
    kept: list[list[Sample]] = []
    for _ in range(MAX_SAMPLING_ROUNDS):
        prompts = data_source.get_samples(chunk)
        if single_round:
            step.prompts_drawn.set()
        # Surplus groups go back as these untouched prompts: never with responses (or partial ones).
        originals = copy.deepcopy(prompts) if state.dynamic_filter or chunk > target else []
        tasks = [asyncio.ensure_future(generate_group(args, g, evaluation=evaluation)) for g in prompts]
        step.filter_stats["rollout/sampling_rounds"] += 1
        surplus = []
        # Decided in prompt order (not completion order), so which groups are kept never depends
        # on timing; each kept group is handed to the sink as soon as it and those before it are done.
        for i, task in enumerate(tasks):
            group = await task
            if not keep_group(args, state, group):
                continue
            if len(kept) < target:
                kept.append(group)
                if step.group_sink is not None and not evaluation:
                    await step.group_sink(group)
            else:
                surplus.append(originals[i])
        if surplus:
            data_source.add_samples(surplus)
        if len(kept) >= target:
            return kept
    raise RuntimeError(f"rollout {rollout_id}: dynamic sampling kept {len(kept)} of {target} groups after "
                       f"{MAX_SAMPLING_ROUNDS} rounds of {chunk}; the filter ({args.dynamic_sampling_filter_path}) "
                       "rejects almost everything — check the reward, or raise --over-sampling-batch-size")


def keep_group(args: Any, state: GenerateState, group: list[Sample]) -> bool:
    if state.dynamic_filter is None:
        return True
    verdict = as_filter_output(state.dynamic_filter(args, group))
    if not verdict.keep:
        state.step.filter_stats["rollout/filter_dropped_groups"] += 1
        state.step.filter_stats[f"rollout/filter_drop/{verdict.reason or 'filtered'}"] += 1
    return verdict.keep
