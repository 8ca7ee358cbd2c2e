"""Sampling parameters and the per-step token sampler of the `hf` engine.

`parse_sampling_params` turns SGLang's `sampling_params` dict into a validated
`SamplingParams` (same key names and defaults as SGLang's `SamplingParams`), rejecting
unknown keys and features this engine does not implement with a message that names them.
`apply_penalties` is SGLang's penalizers on one row's logits (repetition, frequency, presence,
logit bias), applied by the decoder before sampling.

`sample_next_tokens` draws one token per row of a batch:

- temperature == 0 is greedy (argmax of the raw logits), as SGLang does;
- otherwise probabilities are softmax(logits / temperature), filtered by top-k, top-p and
  min-p, and a token is drawn with the exponential race `argmax(p / E)`, E ~ Exp(1). A request
  with a `sampling_seed` takes its noise from a counter-based hash of (seed, how many tokens the
  row has drawn, token id) (`seeded_exponential`), the same integer stream on every device, so a
  seeded request's tokens depend only on (seed, prompt, weights), never on its batch mates.
  An unseeded row takes a fresh seed per token from the engine's shared `torch.Generator`. On a
  GPU the unfiltered case (softmax, noise, race, log-prob) is one compiled function
  (`_race`), compiled when the engine starts.

Log-prob convention (shared with the trainer): the returned log-prob of a sampled token is
`log_softmax(logits / temperature)[token]` for temperature > 0 and `log_softmax(logits)[token]`
for greedy; top-k/top-p/min-p filtering does not change it. This is what SGLang returns by
default (its sampler scales logits by temperature before computing log-probs). A constrained row
(`regex`, `json_schema`, `ebnf`, `structural_tag`: grammar.py) has the tokens its grammar forbids
set to -inf by the decoder before this sampler runs, so its token and log-prob are those of the
constrained distribution.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from relax.backends.hf.grammar import Constraint, parse_constraint

GREEDY_EPS = 1e-6  # SGLang's _SAMPLING_EPS: temperatures below this mean greedy

# Keys SGLang accepts that this engine implements.
_SUPPORTED_DEFAULTS: dict[str, Any] = {
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": -1,
    "min_p": 0.0,
    "max_new_tokens": 128,
    "min_new_tokens": 0,
    "stop": None,
    "stop_token_ids": None,
    "ignore_eos": False,
    "skip_special_tokens": True,
    "spaces_between_special_tokens": True,
    "no_stop_trim": False,
    "sampling_seed": None,
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "repetition_penalty": 1.0,
    "logit_bias": None,
    "stop_regex": None,
    "n": 1,
    # Constrained decoding (grammar.py): at most one of these.
    "regex": None,
    "json_schema": None,
    "ebnf": None,
    "structural_tag": None,
}
MAX_N = 256  # samples per prompt in one request
# Keys SGLang accepts that this engine only accepts at their neutral value.
_NEUTRAL_ONLY: dict[str, Any] = {
    "custom_params": None,
    "stream_interval": None,
}


@dataclass(frozen=True)
class SamplingParams:
    """One request's sampling parameters (SGLang names; `top_k=-1` means off)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    max_new_tokens: int | None = 128
    min_new_tokens: int = 0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    no_stop_trim: bool = False
    sampling_seed: int | None = None
    frequency_penalty: float = 0.0  # minus this times a token's count in the output so far
    presence_penalty: float = 0.0  # minus this once a token occurs in the output
    repetition_penalty: float = 1.0  # prompt or output tokens: logit / p if positive, * p if not
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, added to its logit)
    stop_regex: tuple[re.Pattern, ...] = ()  # a match in the output text stops the row
    n: int = 1  # samples of the prompt (the request expands into n rows)
    constraint: Constraint | None = None  # regex / json_schema / ebnf / structural_tag (grammar.py)

    @property
    def has_penalties(self) -> bool:
        return bool(self.frequency_penalty or self.presence_penalty or self.repetition_penalty != 1.0
                    or self.logit_bias)

    @property
    def is_greedy(self) -> bool:
        return self.temperature < GREEDY_EPS


def _number(params: dict[str, Any], key: str, kind: type) -> Any:
    value = params.get(key, _SUPPORTED_DEFAULTS[key])
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"sampling_params.{key} must be a number, got {value!r}")
    if kind is int:
        if isinstance(value, float) and not value.is_integer():
            raise ValueError(f"sampling_params.{key} must be an integer, got {value!r}")
        return int(value)
    if not math.isfinite(float(value)):
        raise ValueError(f"sampling_params.{key} must be finite, got {value!r}")
    return float(value)


def _flag(params: dict[str, Any], key: str) -> bool:
    value = params.get(key, _SUPPORTED_DEFAULTS[key])
    if not isinstance(value, bool):
        raise ValueError(f"sampling_params.{key} must be true or false, got {value!r}")
    return value


def _stop_strings(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(s, str) and s for s in value):
        raise ValueError(f"sampling_params.stop must be a non-empty string or a list of them, got {value!r}")
    return tuple(value)


def _stop_ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0
                                              for t in value):
        raise ValueError(f"sampling_params.stop_token_ids must be a list of token ids, got {value!r}")
    return tuple(value)


def _logit_bias(value: Any) -> tuple[tuple[int, float], ...]:
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise ValueError(f"sampling_params.logit_bias must map token ids to biases, got {value!r}")
    out = []
    for key, bias in value.items():
        try:
            token = int(key)
        except (TypeError, ValueError):
            raise ValueError(f"sampling_params.logit_bias: {key!r} is not a token id") from None
        if token < 0 or isinstance(bias, bool) or not isinstance(bias, (int, float)) or not math.isfinite(bias):
            raise ValueError(f"sampling_params.logit_bias[{key!r}] must be a finite number for a token id >= 0, "
                             f"got {bias!r}")
        out.append((token, float(bias)))
    return tuple(out)


def _stop_regex(value: Any) -> tuple[re.Pattern, ...]:
    if value is None:
        return ()
    patterns = [value] if isinstance(value, str) else value
    if not isinstance(patterns, list) or not all(isinstance(p, str) and p for p in patterns):
        raise ValueError(f"sampling_params.stop_regex must be a regex or a list of them, got {value!r}")
    try:
        return tuple(re.compile(p) for p in patterns)
    except re.error as exc:
        raise ValueError(f"sampling_params.stop_regex {exc.pattern!r}: {exc}") from None


def _check_keys(params: dict[str, Any]) -> None:
    unknown = sorted(set(params) - set(_SUPPORTED_DEFAULTS) - set(_NEUTRAL_ONLY))
    if unknown:
        raise ValueError(f"unknown sampling_params keys {unknown}; supported: {sorted(_SUPPORTED_DEFAULTS)}")
    for key, neutral in _NEUTRAL_ONLY.items():
        if key in params and params[key] is not None and params[key] != neutral:
            raise ValueError(f"sampling_params.{key}={params[key]!r} is not supported by the hf engine "
                             f"(only {neutral!r}); use the sglang backend for it")


def parse_sampling_params(params: dict[str, Any] | None) -> SamplingParams:
    """Validate an SGLang `sampling_params` dict; raises ValueError naming the bad key."""
    if params is not None and not isinstance(params, dict):
        raise ValueError(f"sampling_params must be an object, got {type(params).__name__}")
    params = dict(params or {})
    _check_keys(params)
    temperature = _number(params, "temperature", float)
    top_p = _number(params, "top_p", float)
    top_k = _number(params, "top_k", int)
    min_p = _number(params, "min_p", float)
    max_new = params.get("max_new_tokens", 128)
    max_new_tokens = None if max_new is None else _number(params, "max_new_tokens", int)
    min_new_tokens = _number(params, "min_new_tokens", int)
    seed = params.get("sampling_seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise ValueError(f"sampling_params.sampling_seed must be an integer, got {seed!r}")
    if temperature < 0:
        raise ValueError(f"sampling_params.temperature must be >= 0, got {temperature}")
    if not 0 < top_p <= 1:
        raise ValueError(f"sampling_params.top_p must be in (0, 1], got {top_p}")
    if top_k == 0 or top_k < -1:
        raise ValueError(f"sampling_params.top_k must be -1 (off) or >= 1, got {top_k}")
    if not 0 <= min_p <= 1:
        raise ValueError(f"sampling_params.min_p must be in [0, 1], got {min_p}")
    if max_new_tokens is not None and max_new_tokens < 0:
        raise ValueError(f"sampling_params.max_new_tokens must be >= 0, got {max_new_tokens}")
    if min_new_tokens < 0 or (max_new_tokens is not None and min_new_tokens > max_new_tokens):
        raise ValueError(f"sampling_params.min_new_tokens must be in [0, max_new_tokens], got {min_new_tokens}")
    frequency, presence = _number(params, "frequency_penalty", float), _number(params, "presence_penalty", float)
    repetition = _number(params, "repetition_penalty", float)
    if not -2 <= frequency <= 2 or not -2 <= presence <= 2:
        raise ValueError(f"sampling_params.frequency_penalty and presence_penalty must be in [-2, 2] (SGLang's "
                         f"range), got {frequency}, {presence}")
    if not 0 < repetition <= 2:
        raise ValueError(f"sampling_params.repetition_penalty must be in (0, 2], got {repetition}")
    n = _number(params, "n", int)
    if not 1 <= n <= MAX_N:
        raise ValueError(f"sampling_params.n must be in [1, {MAX_N}], got {n}")
    return SamplingParams(
        temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p,
        max_new_tokens=max_new_tokens, min_new_tokens=min_new_tokens,
        stop=_stop_strings(params.get("stop")), stop_token_ids=_stop_ids(params.get("stop_token_ids")),
        ignore_eos=_flag(params, "ignore_eos"), skip_special_tokens=_flag(params, "skip_special_tokens"),
        no_stop_trim=_flag(params, "no_stop_trim"), sampling_seed=seed,
        frequency_penalty=frequency, presence_penalty=presence, repetition_penalty=repetition,
        logit_bias=_logit_bias(params.get("logit_bias")), stop_regex=_stop_regex(params.get("stop_regex")), n=n,
        constraint=parse_constraint(params),
    )


def apply_penalties(logits_V: torch.Tensor, params: SamplingParams, prompt_ids: Sequence[int],
                    output_ids: Sequence[int]) -> None:
    """SGLang's penalizers on one row's next-token logits, in place (before temperature): the
    repetition penalty over prompt and output tokens, frequency and presence over the output,
    then the logit bias. Log-probs are taken after them, as SGLang does."""
    vocab = logits_V.shape[-1]
    if params.repetition_penalty != 1.0:
        seen = torch.tensor(sorted({t for t in (*prompt_ids, *output_ids) if t < vocab}), dtype=torch.long,
                            device=logits_V.device)
        if len(seen):
            values = logits_V[seen]
            logits_V[seen] = torch.where(values > 0, values / params.repetition_penalty,
                                         values * params.repetition_penalty)
    if (params.frequency_penalty or params.presence_penalty) and output_ids:
        counts = torch.bincount(torch.tensor(list(output_ids), dtype=torch.long), minlength=vocab)[:vocab]
        counts = counts.to(logits_V.device, logits_V.dtype)
        logits_V -= params.frequency_penalty * counts + params.presence_penalty * (counts > 0).to(logits_V.dtype)
    for token, bias in params.logit_bias:
        if token < vocab:
            logits_V[token] += bias


@dataclass
class SamplingBatch:
    """Per-row sampling parameters of a decode batch as tensors (B = rows still decoding).
    `seeds_B`: the request's sampling_seed (-1: unseeded); `draws_B`: tokens the row has drawn."""

    temperature_B: torch.Tensor
    top_p_B: torch.Tensor
    top_k_B: torch.Tensor
    min_p_B: torch.Tensor
    greedy_B: torch.Tensor
    seeds_B: torch.Tensor
    draws_B: torch.Tensor
    # Host copies of the per-row flags the sampler branches on (no device sync per step).
    greedy: list[bool]
    seeded: list[bool]
    filtered: list[bool]

    @classmethod
    def build(cls, params: Sequence[SamplingParams], device: torch.device) -> "SamplingBatch":
        greedy = [p.is_greedy for p in params]
        seeds = [-1 if p.sampling_seed is None else int(p.sampling_seed) % 2**63 for p in params]
        return cls(
            temperature_B=torch.tensor([1.0 if g else p.temperature for p, g in zip(params, greedy)],
                                       dtype=torch.float32, device=device),
            top_p_B=torch.tensor([p.top_p for p in params], dtype=torch.float32, device=device),
            top_k_B=torch.tensor([p.top_k for p in params], dtype=torch.long, device=device),
            min_p_B=torch.tensor([p.min_p for p in params], dtype=torch.float32, device=device),
            greedy_B=torch.tensor(greedy, dtype=torch.bool, device=device),
            seeds_B=torch.tensor(seeds, dtype=torch.long, device=device),
            draws_B=torch.zeros(len(params), dtype=torch.long, device=device),
            greedy=greedy, seeded=[seed >= 0 for seed in seeds],
            filtered=[p.top_k > 0 or p.top_p < 1 or p.min_p > 0 for p in params],
        )

    def _fields(self) -> tuple[torch.Tensor, ...]:
        return (self.temperature_B, self.top_p_B, self.top_k_B, self.min_p_B, self.greedy_B, self.seeds_B,
                self.draws_B)

    def select(self, keep: list[int]) -> "SamplingBatch":
        index = torch.tensor(keep, dtype=torch.long, device=self.greedy_B.device)
        return SamplingBatch(*(t[index] for t in self._fields()), [self.greedy[i] for i in keep],
                             [self.seeded[i] for i in keep], [self.filtered[i] for i in keep])

    def concat(self, other: "SamplingBatch") -> "SamplingBatch":
        """This batch's rows followed by `other`'s (a group joining a running batch)."""
        return SamplingBatch(*(torch.cat([a, b]) for a, b in zip(self._fields(), other._fields())),
                             self.greedy + other.greedy, self.seeded + other.seeded, self.filtered + other.filtered)

    @property
    def needs_filter(self) -> bool:
        return any(self.filtered)


def filter_probs(probs_BV: torch.Tensor, top_k_B: torch.Tensor, top_p_B: torch.Tensor,
                 min_p_B: torch.Tensor) -> torch.Tensor:
    """Zero the probabilities outside top-k / the top-p nucleus / below min_p * max (not renormalised)."""
    sorted_BV, index_BV = probs_BV.sort(dim=-1, descending=True)
    rank_V = torch.arange(probs_BV.shape[-1], device=probs_BV.device)
    drop_BV = (top_k_B[:, None] > 0) & (rank_V[None, :] >= top_k_B[:, None])
    mass_before_BV = sorted_BV.cumsum(dim=-1) - sorted_BV
    drop_BV |= mass_before_BV > top_p_B[:, None]
    drop_BV |= sorted_BV < (min_p_B[:, None] * sorted_BV[:, :1])
    drop_BV[:, 0] = False  # the most likely token always survives
    sorted_BV = sorted_BV.masked_fill(drop_BV, 0.0)
    return torch.zeros_like(probs_BV).scatter_(-1, index_BV, sorted_BV)


_MASK32 = 0xFFFFFFFF
_token_keys: dict[tuple[int, str], torch.Tensor] = {}


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (two multiply-xorshift rounds) on int64 tensors holding values < 2**32;
    every product stays below 2**63, so no overflow."""
    x = (((x >> 16) ^ x) * 0x45D9F3B) & _MASK32
    x = (((x >> 16) ^ x) * 0x45D9F3B) & _MASK32
    return (x >> 16) ^ x


def token_keys(vocab: int, device: torch.device) -> torch.Tensor:
    """Per token id, its hash key (cached per vocabulary size and device)."""
    key = (vocab, str(device))
    if key not in _token_keys:
        _token_keys[key] = _mix32(torch.arange(vocab, dtype=torch.long, device=device) * 0x9E3779B1 & _MASK32)
    return _token_keys[key]


def _exponential_from_keys(seeds_B: torch.Tensor, draws_B: torch.Tensor, token_keys_V: torch.Tensor) -> torch.Tensor:
    row_B = _mix32((seeds_B & _MASK32) ^ _mix32(((seeds_B >> 32) & _MASK32) ^ _mix32(draws_B & _MASK32)))
    bits_BV = _mix32(row_B[:, None] ^ token_keys_V[None, :])
    uniform_BV = ((bits_BV >> 8).to(torch.float32) + 0.5) * 2.0 ** -24  # in (0, 1)
    return -torch.log(uniform_BV)


def seeded_exponential(seeds_B: torch.Tensor, draws_B: torch.Tensor, vocab: int) -> torch.Tensor:
    """Exp(1) noise [B, vocab] that depends only on (seed, draw index, token id) per row (the
    integer hash is the same on every device)."""
    return _exponential_from_keys(seeds_B, draws_B, token_keys(vocab, seeds_B.device))


def _race(logits_BV: torch.Tensor, temperature_B: torch.Tensor, greedy_B: torch.Tensor, seeds_B: torch.Tensor,
          draws_B: torch.Tensor, token_keys_V: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Unfiltered sampling: the exponential race argmax(p / E) as argmax(log p - log E); greedy
    rows take the argmax of the raw logits. Returns (tokens_B, logprobs_B)."""
    logits_BV = logits_BV.float()
    logprobs_BV = torch.log_softmax(logits_BV / temperature_B[:, None], dim=-1)
    noise_BV = _exponential_from_keys(seeds_B, draws_B, token_keys_V)
    sampled_B = (logprobs_BV - torch.log(noise_BV)).argmax(dim=-1)
    tokens_B = torch.where(greedy_B, logits_BV.argmax(dim=-1), sampled_B)
    return tokens_B, logprobs_BV.gather(-1, tokens_B[:, None]).squeeze(-1)


_compiled: dict[str, Any] = {}


def _race_kernel(device: torch.device):
    """On a GPU `_race` is compiled into a few fused kernels (eager it is ~25 passes over the
    [B, vocab] logits, a third of a decode step at batch 256); eager elsewhere or if compiling fails."""
    if device.type != "cuda" or _compiled.get("failed"):
        return _race
    if "race" not in _compiled:
        _compiled["race"] = torch.compile(_race, dynamic=True)
    return _compiled["race"]


def warm_up_sampler(vocab: int, device: torch.device) -> None:
    """Compile the GPU sampler now (batch sizes 1 and 2: dynamic shapes after that), not in the
    first rollout."""
    params = parse_sampling_params({"temperature": 1.0, "sampling_seed": 0})
    for rows in (1, 2):
        sample_next_tokens(torch.zeros(rows, vocab, device=device), SamplingBatch.build([params] * rows, device))


def _row_seeds(batch: SamplingBatch, shared: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(seed, draw) per row: the request's own, or for an unseeded row a fresh seed from the
    engine's shared generator (draw 0)."""
    if all(batch.seeded):
        return batch.seeds_B, batch.draws_B
    fresh_B = torch.randint(0, 2**62, (len(batch.seeded),), generator=shared, device=batch.seeds_B.device)
    if not any(batch.seeded):
        return fresh_B, torch.zeros_like(batch.draws_B)
    seeded_B = batch.seeds_B >= 0
    return torch.where(seeded_B, batch.seeds_B, fresh_B), torch.where(seeded_B, batch.draws_B, 0)


def sample_next_tokens(logits_BV: torch.Tensor, batch: SamplingBatch,
                       shared_generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row. Returns (tokens_B, logprobs_B) under the convention in the module doc."""
    vocab, device = logits_BV.shape[1], logits_BV.device
    if all(batch.greedy):
        logits_BV = logits_BV.float()
        tokens_B = logits_BV.argmax(dim=-1)
        logprobs_B = torch.log_softmax(logits_BV, dim=-1).gather(-1, tokens_B[:, None]).squeeze(-1)
    elif not batch.needs_filter:
        seeds_B, draws_B = _row_seeds(batch, shared_generator)
        args = (logits_BV, batch.temperature_B, batch.greedy_B, seeds_B, draws_B, token_keys(vocab, device))
        kernel = _race_kernel(device)
        try:
            tokens_B, logprobs_B = kernel(*args)
        except Exception as exc:  # noqa: BLE001 - a compiler failure must not stop generation
            if kernel is _race:
                raise
            import logging

            logging.getLogger(__name__).warning("compiling the sampler failed (%s); sampling with eager ops", exc)
            _compiled["failed"] = True
            tokens_B, logprobs_B = _race(*args)
    else:  # top-k / top-p / min-p: filtered probabilities, then the race
        logits_BV = logits_BV.float()
        logprobs_BV = torch.log_softmax(logits_BV / batch.temperature_B[:, None], dim=-1)
        probs_BV = filter_probs(logprobs_BV.exp(), batch.top_k_B, batch.top_p_B, batch.min_p_B)
        seeds_B, draws_B = _row_seeds(batch, shared_generator)
        sampled_B = (probs_BV / seeded_exponential(seeds_B, draws_B, vocab)).argmax(dim=-1)
        tokens_B = torch.where(batch.greedy_B, logits_BV.argmax(dim=-1), sampled_B)
        logprobs_B = logprobs_BV.gather(-1, tokens_B[:, None]).squeeze(-1)
    batch.draws_B += 1
    return tokens_B, logprobs_B
