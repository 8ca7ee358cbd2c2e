"""Request models and reply builders for the `hf` engine's SGLang-native HTTP API.

Field names and defaults follow SGLang's `io_struct.py` (GenerateReqInput,
InitWeightsUpdateGroupReqInput, UpdateWeightsFromDistributedReqInput, PauseGenerationReqInput,
AbortReq, Release/ResumeMemoryOccupationReqInput). Unknown top-level fields are ignored as
SGLang's many optional fields would be; unknown *sampling* keys are rejected (see sampling.py).
Reply shapes: `{"text", "output_ids", "meta_info": {"id", "finish_reason", "prompt_tokens",
"completion_tokens", "cached_tokens", "weight_version", "e2e_latency",
"output_token_logprobs": [[logprob, token_id, text_or_None], ...]}}`.

Input-token log-probs: with `return_logprob` and `logprob_start_len` k >= 0 the reply also has
`meta_info.input_token_logprobs`, one `[logprob, token_id, text_or_None]` per prompt token from
position k on; position 0 has no context, so its logprob is None (SGLang's convention; -1, the
default, returns output-token logprobs only). They are log-softmax of the raw logits (no
temperature). `max_new_tokens: 0` scores a sequence without generating: the way a teacher
engine serves on-policy distillation. `top_logprobs_num` is not supported.

Media (SGLang's multimodal fields): `image_data` — for one prompt an item or a list of items, for
a batch one entry per prompt (an item, a list, or null). An item is a URL, a local path, a
`data:image/...;base64,` URI or raw base64. The prompt's `input_ids` must already hold each
image's expanded pad tokens (`relax.utils.multimodal.processor`); the engine checks the count.
`audio_data` (Omni models) likewise: a WAV (PCM or 32-bit float, the rollout's lossless form) as a
path, URL or `data:audio/wav;base64,` URI, each audio's `<|audio_pad|>` tokens in the ids.
`video_data` (VL and Omni models): per video a file (path, URL, data URI or base64; decoded with
PyAV and sampled per the default video flags) or `{"frames": [frame items], "fps": <rate>}`, frames
already sampled and sized (the rollout's form: the video flags were applied), each video's
`<|video_pad|>` tokens in the ids. A modality the model has no encoder for is a 400.

Routed experts (MoE, an engine started with `--enable-return-routed-experts`): `return_routed_experts`
adds `meta_info.routed_experts`, base64 of int32 `[n, layers, top_k]` for positions
`[routed_experts_start_len, prompt + output - 1)` (SGLang's fields; `relax.utils.routing`).
"""

from __future__ import annotations

import dataclasses
import uuid
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

from relax.backends.hf.rows import RowResult
from relax.backends.hf.sampling import SamplingParams, parse_sampling_params
from relax.utils.routing import encode_reply

MAX_BATCH_ITEMS = 4096


class GenerateRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    text: StrictStr | list[StrictStr] | None = None
    input_ids: list[StrictInt] | list[list[StrictInt]] | None = None
    sampling_params: dict[str, Any] | list[dict[str, Any]] | None = None
    return_logprob: StrictBool | list[StrictBool] | None = None
    logprob_start_len: StrictInt | list[StrictInt] | None = None
    top_logprobs_num: StrictInt | list[StrictInt] | None = None
    return_text_in_logprobs: StrictBool = False
    rid: StrictStr | list[StrictStr] | None = None
    stream: StrictBool = False
    image_data: Any = None
    video_data: Any = None
    audio_data: Any = None
    return_routed_experts: StrictBool | list[StrictBool] | None = None
    routed_experts_start_len: StrictInt | list[StrictInt] | None = None


class InitWeightsUpdateGroupRequest(BaseModel):
    master_address: StrictStr = Field(min_length=1)
    master_port: StrictInt = Field(ge=1, le=65535)
    rank_offset: StrictInt = Field(ge=1)
    world_size: StrictInt = Field(ge=2)
    group_name: StrictStr = "weight_update_group"
    backend: Literal["nccl", "gloo"] = "nccl"


class UpdateWeightsFromDistributedRequest(BaseModel):
    names: list[StrictStr]
    dtypes: list[StrictStr]
    shapes: list[list[StrictInt]]
    group_name: StrictStr = "weight_update_group"
    flush_cache: StrictBool = True
    abort_all_requests: StrictBool = False
    weight_version: StrictStr | None = None
    load_format: StrictStr | None = None
    # Relax's extension (the hf engine advertises `weight_buckets_in_order` in /server_info): the
    # bucket's place in the push, so a sender may post several at once and each loads in turn.
    bucket_index: StrictInt | None = Field(default=None, ge=0)


class ArmedBucket(BaseModel):
    """One bucket of an armed push: its tensors in broadcast order and its flat buffer's length."""

    names: list[StrictStr] = Field(min_length=1)
    dtypes: list[StrictStr]
    shapes: list[list[StrictInt]]
    bytes: StrictInt | None = Field(default=None, ge=0)


class ArmWeightUpdateRequest(BaseModel):
    """Relax's armed push (`weight_push_armed`; relax/distributed/weights/armed.py): every bucket of
    the push at once; generation is paused (`pause_mode`, as /pause_generation) and a session opened.
    `layout_id` (`armed.layout_digest` of the buckets) with `buckets`: the engine keeps the layout under
    it; alone: the layout kept (409 when the engine does not hold it: the sender sends the buckets)."""

    group_name: StrictStr = "weight_update_group"
    buckets: list[ArmedBucket] | None = Field(default=None, min_length=1)
    layout_id: StrictStr | None = Field(default=None, min_length=1, max_length=128)
    load_format: StrictStr | None = None
    weight_version: StrictStr | None = None
    flush_cache: StrictBool = True
    pause_mode: Literal["abort", "retract", "in_place"] = "abort"
    # Sent ahead of the buckets (`weight_push_ahead`: the sender broadcasts without waiting for the reply):
    # a refusal (409, or 400 `success: false`) drains the buckets, `bytes` long each (their flat lengths).
    ahead: StrictBool = False
    bytes: list[StrictInt] | None = Field(default=None, min_length=1, max_length=1_000_000)


class EndWeightUpdateRequest(BaseModel):
    """SGLang's /end_weight_update takes no fields; Relax's armed push adds one: resume generation
    once the session has ended (success or not), which saves the /continue_generation round trip."""

    continue_generation: StrictBool = False


class UpdateWeightsFromTensorRequest(BaseModel):
    """SGLang's colocated update: per tensor-parallel rank, base64 of torch's multiprocessing
    pickle of [(name, tensor)] (CUDA IPC handles; `relax.distributed.weights.ipc`)."""

    serialized_named_tensors: list[StrictStr] = Field(min_length=1)
    load_format: StrictStr | None = None
    flush_cache: StrictBool = True
    abort_all_requests: StrictBool = False
    weight_version: StrictStr | None = None


class GroupNameRequest(BaseModel):
    group_name: StrictStr = "weight_update_group"


class PauseGenerationRequest(BaseModel):
    mode: Literal["abort", "retract", "in_place"] = "abort"


class AbortRequest(BaseModel):
    rid: StrictStr | None = None
    abort_all: StrictBool = False


class MemoryRequest(BaseModel):
    tags: list[Literal["weights", "kv_cache"]] | None = None


class UpdateWeightVersionRequest(BaseModel):
    new_version: StrictStr
    abort_all_requests: StrictBool = True


@dataclass
class GenerateItem:
    """One sequence of a (possibly batched) /generate request."""

    rid: str
    input_ids: list[int]
    params: SamplingParams
    return_logprob: bool
    logprob_start_len: int | None = None  # input-token logprobs from this position (None: none)
    media: dict[str, list[str]] | None = None  # {"image": [items]} (SGLang's image_data, ...)
    routed_experts_start: int | None = None  # return_routed_experts from this position (None: not asked)


def _per_item(value: Any, n: int, field: str, default: Any) -> list[Any]:
    if value is None:
        return [default] * n
    if isinstance(value, list):
        if len(value) != n:
            raise ValueError(f"{field} has {len(value)} entries but the batch has {n} prompts")
        return value
    return [value] * n


def _prompts(req: GenerateRequest, tokenizer: Any) -> tuple[list[list[int]], bool]:
    if (req.text is None) == (req.input_ids is None):
        raise ValueError("give exactly one of 'text' or 'input_ids'")
    if req.input_ids is not None:
        batched = bool(req.input_ids) and isinstance(req.input_ids[0], list)
        prompts = req.input_ids if batched else [req.input_ids]
    else:
        batched = isinstance(req.text, list)
        prompts = [tokenizer.encode(t) for t in (req.text if batched else [req.text])]
    return [list(p) for p in prompts], batched


MEDIA_FIELDS = {"image_data": "image", "video_data": "video", "audio_data": "audio"}


def _media(req: GenerateRequest, n: int, batched: bool) -> list[dict[str, list[str]] | None]:
    """Per prompt, its media items by modality (None: text only), from SGLang's `*_data` fields."""
    out: list[dict[str, list[str]]] = [{} for _ in range(n)]
    for name, modality in MEDIA_FIELDS.items():
        value = getattr(req, name)
        if value is None:
            continue
        if batched:
            if not isinstance(value, list) or len(value) != n:
                raise ValueError(f"{name}: a batched request needs one entry per prompt ({n}), each an item, a "
                                 "list of items or null")
            per_prompt = value
        else:
            per_prompt = [value]
        for i, entry in enumerate(per_prompt):
            items = [] if entry is None else entry if isinstance(entry, list) else [entry]
            for item in items:
                _check_media_item(name, i, item)
            if items:
                out[i][modality] = items
    return [m or None for m in out]


def _check_media_item(name: str, i: int, item: Any) -> None:
    """A media item is a non-empty string (URL, path, data URI or base64); a video may also be
    `{"frames": [frame strings], "fps": <rate of those frames>}` (frames already sampled and sized)."""
    if isinstance(item, str) and item:
        return
    if name == "video_data" and isinstance(item, dict):
        frames, fps = item.get("frames"), item.get("fps", 2.0)
        if (isinstance(frames, list) and frames and all(isinstance(f, str) and f for f in frames)
                and isinstance(fps, (int, float)) and not isinstance(fps, bool) and fps > 0
                and set(item) <= {"frames", "fps"}):
            return
        raise ValueError(f"video_data of prompt {i}: a frame-list video is {{\"frames\": [non-empty strings], "
                         f"\"fps\": <positive number>}}, got keys {sorted(item)}")
    what = "a non-empty string (URL, path, data URI or base64)" + (
        " or {\"frames\": [...], \"fps\": <fps>}" if name == "video_data" else "")
    raise ValueError(f"{name} of prompt {i}: each item must be {what}")


def check_prompt(i: int, ids: list[int], params: SamplingParams, vocab_size: int, max_context_len: int) -> None:
    where = f"prompt {i}"
    if not ids:
        raise ValueError(f"{where} is empty")
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"{where} has token ids outside [0, {vocab_size}): {bad[:5]}")
    if len(ids) >= max_context_len:
        raise ValueError(f"{where}: the input ({len(ids)} tokens) is longer than the model's context length "
                         f"({max_context_len} tokens)")
    if params.max_new_tokens is not None and len(ids) + params.max_new_tokens > max_context_len:
        raise ValueError(f"{where}: input ({len(ids)}) + max_new_tokens ({params.max_new_tokens}) exceeds the "
                         f"context length ({max_context_len}); lower max_new_tokens")


def normalize_generate(req: GenerateRequest, tokenizer: Any, *, vocab_size: int, max_context_len: int
                       ) -> tuple[list[GenerateItem], bool]:
    """Expand a /generate request into items; raises ValueError with a message for a 400."""
    top = req.top_logprobs_num if isinstance(req.top_logprobs_num, list) else [req.top_logprobs_num]
    if any(v not in (None, 0) for v in top):
        raise ValueError("top_logprobs_num is not supported by the hf engine (output- and input-token logprobs are)")
    prompts, batched = _prompts(req, tokenizer)
    n = len(prompts)
    if not 1 <= n <= MAX_BATCH_ITEMS:
        raise ValueError(f"a batch must have 1 to {MAX_BATCH_ITEMS} prompts, got {n}")
    params = [parse_sampling_params(p) for p in _per_item(req.sampling_params, n, "sampling_params", None)]
    logprob = [bool(v) for v in _per_item(req.return_logprob, n, "return_logprob", False)]
    starts = [_logprob_start(i, v, len(ids)) if lp else None
              for i, (v, ids, lp) in enumerate(zip(_per_item(req.logprob_start_len, n, "logprob_start_len", None),
                                                   prompts, logprob))]
    if isinstance(req.rid, str):
        rids = [req.rid] if not batched else [f"{req.rid}_{i}" for i in range(n)]
    else:
        rids = _per_item(req.rid, n, "rid", None)
        rids = [r if r is not None else uuid.uuid4().hex for r in rids]
    for i, (ids, p) in enumerate(zip(prompts, params)):
        check_prompt(i, ids, p, vocab_size, max_context_len)
    media = _media(req, n, batched)
    routed = _routed_starts(req, prompts)
    items = [GenerateItem(r, ids, p, lp, k, m, e)
             for r, ids, p, lp, k, m, e in zip(rids, prompts, params, logprob, starts, media, routed)]
    if any(p.n > 1 for p in params):  # parallel sampling: n rows per prompt, prompt-major, a list reply
        items = expand_samples(items)
        if len(items) > MAX_BATCH_ITEMS:
            raise ValueError(f"a batch must have at most {MAX_BATCH_ITEMS} samples, got {len(items)} (prompts x n)")
        batched = True
    return items, batched


def expand_samples(items: list[GenerateItem]) -> list[GenerateItem]:
    """Each item as its `n` samples (prompt-major)."""
    return [sample for item in items for sample in _copies(item)]


def _copies(item: GenerateItem) -> list[GenerateItem]:
    """The n samples of one item: rids `<rid>_<j>`; a seeded request's copy j is seeded `seed + j`
    (the same seed would give n equal samples)."""
    n = item.params.n
    if n == 1:
        return [item]
    return [dataclasses.replace(item, rid=f"{item.rid}_{j}", params=dataclasses.replace(
        item.params, n=1, sampling_seed=None if item.params.sampling_seed is None else item.params.sampling_seed + j))
        for j in range(n)]


def _routed_starts(req: GenerateRequest, prompts: list[list[int]]) -> list[int | None]:
    """Per prompt, where its routed experts are returned from (`routed_experts_start_len`, SGLang's
    rule: within [0, prompt tokens]); None where `return_routed_experts` is off."""
    n = len(prompts)
    asked = _per_item(req.return_routed_experts, n, "return_routed_experts", False)
    starts = _per_item(req.routed_experts_start_len, n, "routed_experts_start_len", 0)
    for i, (on, start, ids) in enumerate(zip(asked, starts, prompts)):
        if on and not 0 <= start <= len(ids):
            raise ValueError(f"prompt {i}: routed_experts_start_len must be in [0, {len(ids)}] (the prompt's "
                             f"tokens), got {start}")
    return [start if on else None for on, start in zip(asked, starts)]


def _logprob_start(i: int, value: int | None, prompt_len: int) -> int | None:
    """`logprob_start_len` of prompt i: None/-1 -> no input logprobs, else a position in the prompt."""
    if value is None or value == -1:
        return None
    if not 0 <= value < prompt_len:
        raise ValueError(f"prompt {i}: logprob_start_len must be -1 or in [0, {prompt_len}) (the prompt has "
                         f"{prompt_len} tokens), got {value}")
    return value


def build_output(item: GenerateItem, result: RowResult, *, weight_version: str, e2e_latency: float,
                 tokenizer: Any = None) -> dict[str, Any]:
    """SGLang's /generate reply for one item (`tokenizer` given: logprob triples carry token text)."""
    meta: dict[str, Any] = {
        "id": item.rid, "finish_reason": result.finish_reason, "prompt_tokens": len(item.input_ids),
        "completion_tokens": len(result.output_ids), "cached_tokens": 0, "weight_version": weight_version,
        "e2e_latency": e2e_latency,
    }
    if item.return_logprob:
        meta["output_token_logprobs"] = [
            [lp, tok, tokenizer.decode([tok]) if tokenizer is not None else None]
            for lp, tok in zip(result.output_logprobs, result.output_ids)
        ]
        if item.logprob_start_len is not None and result.input_logprobs is not None:
            start = item.logprob_start_len
            meta["input_token_logprobs"] = [
                [lp, tok, tokenizer.decode([tok]) if tokenizer is not None else None]
                for lp, tok in zip(result.input_logprobs[start:], item.input_ids[start:])
            ]
    if item.routed_experts_start is not None:  # SGLang's positions [start, prompt + output - 1)
        recorded = result.routed_experts
        meta["routed_experts"] = encode_reply(
            recorded[item.routed_experts_start:] if recorded is not None else np.zeros((0,), dtype=np.int32))
    return {"text": result.text, "output_ids": list(result.output_ids), "meta_info": meta}
