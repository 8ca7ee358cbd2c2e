"""The model side of multimodal inputs, shared by the rollout, the `hf` engine and the trainers.

One prompt with `<image>` / `<audio>` placeholders and its media become (1) token ids in which
each placeholder is expanded to the model's own media tokens (`<|vision_start|>` + one
`<|image_pad|>` per merged patch + `<|vision_end|>` for Qwen-VL; `<|audio_start|>` + one
`<|audio_pad|>` per audio-encoder output + `<|audio_end|>` for Qwen3-Omni), and (2) the tensors
the model's encoders take (`pixel_values`, `image_grid_thw`, `input_features`,
`feature_attention_mask`). The rollout sends the ids and the media (SGLang's `image_data`,
`audio_data`) to the engine, which recomputes the tensors from the media with the same processor
and checks they match the ids; the trainers get the rollout's tensors through TransferQueue
(`to_bytes` / `from_bytes`: safetensors, no pickle on the data plane). Positions (M-RoPE:
temporal, height, width) come from the model's own `get_rope_index` in every one of them
(`rope_positions`), so the engine's and the trainer's log-probs of a sample agree.

Audio: an item (WAV bytes / path / data URI, an `{"array", "sampling_rate"}` struct, or a bare
waveform taken to be at `--audio-sample-rate`, the rate the data loader resampled it to) is
decoded and resampled to the feature extractor's rate (`relax.utils.multimodal.audio`), then
each audio alone goes through the checkpoint's `WhisperFeatureExtractor` (alone: its features
do not depend on what it is batched with). Its pad count is the model's own output-length rule
on its feature frames (`Family.audio_tokens`). The request carries the waveform as a 32-bit
float WAV data URI, so the engine decodes the very samples the rollout used.

Why not `AutoProcessor`: the Qwen-VL / Omni processor classes also build a video processor,
which needs torchvision; this expansion is the processors' rule, built from the checkpoint's
image processor, feature extractor and tokenizer, which load anywhere.

`FAMILIES` is the one registry of supported multimodal model types. Failures are `MediaError`
(a bad item, a placeholder/item count mismatch), naming what to fix.
"""

from __future__ import annotations

import base64
import io
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from relax.utils.multimodal.config import AudioConfig
from relax.utils.multimodal.sources import MediaError

PLACEHOLDERS = {"image": "<image>", "video": "<video>", "audio": "<audio>"}


def submodule(model: Any, name: str) -> Any:
    """`model.model.<name>` (transformers >= 5.2x's layout) or `model.<name>` (older releases put a
    thinker's towers and `get_rope_index` on the top-level model)."""
    body = getattr(model, "model", None)
    return getattr(body, name) if body is not None and hasattr(body, name) else getattr(model, name)


def _vl_rope_index(model: Any, ids_1L: Any, grids: Any, audio_frames: Any) -> Any:
    """Qwen2.5-VL / Qwen3-VL `get_rope_index` on one unpadded row -> `(3, 1, L)`."""
    import torch

    types_1L = (ids_1L == model.config.image_token_id).to(torch.int32)
    return submodule(model, "get_rope_index")(ids_1L, types_1L, image_grid_thw=grids)[0]


def _omni_rope_index(model: Any, ids_1L: Any, grids: Any, audio_frames: Any) -> Any:
    """Qwen3-Omni thinker `get_rope_index` on one unpadded row -> `(3, 1, L)`: audio tokens take
    consecutive positions (`audio_seqlens`: each audio's feature frames), images a (t, h, w) grid;
    no audio track in video."""
    position_ids, _ = submodule(model, "get_rope_index")(ids_1L, image_grid_thw=grids, attention_mask=ids_1L.new_ones(
        ids_1L.shape), use_audio_in_video=False, audio_seqlens=audio_frames)
    return position_ids


def _qwen3_omni_audio_tokens(frames_N: Any, config: Any) -> Any:
    """The Qwen3-Omni audio encoder's output length per audio, from its feature frames [N] (the
    model's own rule: 13 tokens per 100-frame window, the remainder through 3 stride-2 convs)."""
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import _get_feat_extract_output_lengths

    return _get_feat_extract_output_lengths(frames_N, int(config.audio_config.n_window))


@dataclass(frozen=True)
class Family:
    """How one model type lays out its media tokens (`<open><pad>*n<close>` per item)."""

    image_pad: str             # the token repeated once per merged image patch
    image_open: str
    image_close: str
    rope_index: Callable[..., Any] = _vl_rope_index  # (model, ids_1L, image grids, audio frames) -> (3, 1, L)
    audio_pad: str | None = None    # None: the model takes no audio
    audio_open: str | None = None
    audio_close: str | None = None
    audio_tokens: Callable[..., Any] | None = None  # (feature frames [N], config) -> pad tokens [N]
    loader: str = "AutoModelForImageTextToText"  # the transformers auto class that builds it

    @property
    def modalities(self) -> tuple[str, ...]:
        return ("image", "audio") if self.audio_pad else ("image",)


QWEN_VL = Family(image_pad="<|image_pad|>", image_open="<|vision_start|>", image_close="<|vision_end|>")
QWEN3_OMNI = Family(image_pad="<|image_pad|>", image_open="<|vision_start|>", image_close="<|vision_end|>",
                    rope_index=_omni_rope_index, audio_pad="<|audio_pad|>", audio_open="<|audio_start|>",
                    audio_close="<|audio_end|>", audio_tokens=_qwen3_omni_audio_tokens)
FAMILIES: dict[str, Family] = {
    "qwen2_5_vl": QWEN_VL,
    "qwen3_vl": QWEN_VL,
    "qwen3_vl_moe": QWEN_VL,
    "qwen3_omni_moe_thinker": QWEN3_OMNI,
}
MEDIA_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
AUDIO_TOKENS = ("<|audio_start|>", "<|audio_end|>", "<|audio_pad|>")


def model_type(config: Any) -> str | None:
    return getattr(config, "model_type", None)


def is_multimodal(config: Any) -> bool:
    """A model type this module handles (its checkpoint has encoders that take media)."""
    return model_type(config) in FAMILIES


def load_model(path: str, *, dtype: Any = None, config: Any = None, from_config: bool = False) -> Any:
    """The transformers model of a checkpoint: the family's auto class for multimodal ones,
    `AutoModelForCausalLM` otherwise. `from_config`: random weights from `config`."""
    import transformers

    config = config or transformers.AutoConfig.from_pretrained(path)
    family = FAMILIES.get(model_type(config))
    auto = getattr(transformers, family.loader if family else "AutoModelForCausalLM")
    if from_config:
        return auto.from_config(config, dtype=dtype)
    return auto.from_pretrained(path, dtype=dtype)


def decoder_layers(model: Any) -> Any:
    """The transformer blocks of the language model (`model.model.layers` or, for VL models,
    `model.model.language_model.layers`), for FSDP wrapping and recompute."""
    body = model.model
    return body.layers if hasattr(body, "layers") else body.language_model.layers


# ---- media items -> request fields -----------------------------------------------------------

def image_to_data_uri(item: Any) -> str:
    """An image item (PIL, uint8 [H, W, 3], path, bytes, ...) as a PNG data URI: lossless, so the
    engine decodes exactly the pixels the rollout processed (SGLang accepts data URIs)."""
    from relax.utils.multimodal.image import to_pil

    buf = io.BytesIO()
    to_pil(item).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def audio_to_data_uri(waveform_T: Any, rate: int) -> str:
    """A float waveform [T] as a 32-bit float WAV data URI: lossless (16-bit PCM would round), so
    the engine decodes exactly the samples the rollout processed."""
    from relax.utils.multimodal.audio import float_wav

    return "data:audio/wav;base64," + base64.b64encode(float_wav(waveform_T, rate)).decode("ascii")


# ---- serialisation for TransferQueue ----------------------------------------------------------

def to_bytes(tensors: dict[str, Any] | None) -> bytes:
    """A row's model tensors as safetensors bytes (b"" for a text-only row)."""
    if not tensors:
        return b""
    from safetensors.torch import save

    return save({k: v.contiguous() for k, v in tensors.items()})


def from_bytes(data: Any) -> dict[str, Any]:
    """Inverse of `to_bytes`; accepts bytes or a uint8 tensor (TransferQueue's column value)."""
    if data is None:
        return {}
    if hasattr(data, "numpy"):
        data = data.numpy().tobytes()
    if not data:
        return {}
    from safetensors.torch import load

    return load(bytes(data))


def collate(rows: Sequence[dict[str, Any] | None]) -> dict[str, Any]:
    """Model kwargs for a batch of rows: each tensor concatenated along dim 0 in row order (the
    encoders take every image of the batch as one sequence of patches, `image_grid_thw` says
    where each starts; every audio as one row of `input_features`). Tensors whose other dims
    differ (audios with different frame counts: `input_features [N, mel, F]`,
    `feature_attention_mask [N, F]`) are zero-padded to the largest first, so padded frames are
    masked out. Rows without media add nothing."""
    keys = sorted({k for r in rows if r for k in r})
    return {k: _cat_padded([r[k] for r in rows if r and k in r]) for k in keys}


def _cat_padded(tensors: list[Any]) -> Any:
    import torch

    dims = [max(t.shape[d] for t in tensors) for d in range(1, tensors[0].dim())]
    padded = []
    for t in tensors:
        pad = [p for d in reversed(range(1, t.dim())) for p in (0, dims[d - 1] - t.shape[d])]
        padded.append(torch.nn.functional.pad(t, pad) if any(pad) else t)
    return torch.cat(padded)


# ---- the processor -----------------------------------------------------------------------------

@dataclass
class Encoded:
    """One prompt's model inputs: `input_ids` (placeholders expanded), the encoder `tensors`, and
    the request fields for SGLang's /generate (`image_data`: PNG data URIs; `audio_data`: float
    WAV data URIs)."""

    input_ids: list[int]
    tensors: dict[str, Any] = field(default_factory=dict)
    request: dict[str, list[str]] = field(default_factory=dict)


class MultimodalProcessor:
    """Placeholder expansion and encoder tensors for one checkpoint (see the module doc).
    `audio`: the audio flags (`--audio-sample-rate`: the rate of bare waveform items)."""

    def __init__(self, model_path: str, tokenizer: Any = None, audio: AudioConfig | None = None) -> None:
        from transformers import AutoConfig, AutoImageProcessor, AutoTokenizer

        self.config = AutoConfig.from_pretrained(model_path)
        self.family = FAMILIES.get(model_type(self.config))
        if self.family is None:
            raise MediaError(f"{model_path}: model type {model_type(self.config)!r} takes no media; multimodal "
                             f"models are {sorted(FAMILIES)} (docs/multimodal.md)")
        self.tokenizer = tokenizer or AutoTokenizer.from_pretrained(model_path)
        self.image_processor = AutoImageProcessor.from_pretrained(model_path)
        self.merge = int(self.config.vision_config.spatial_merge_size)
        self.image_token_id = int(self.config.image_token_id)
        self.video_token_id = int(getattr(self.config, "video_token_id", -1) or -1)
        vocab = self.tokenizer.get_vocab()
        # Media placeholders the model must never emit as text (the engine does not sample them).
        self.media_token_ids = sorted({vocab[t] for t in MEDIA_TOKENS + AUDIO_TOKENS if t in vocab})
        self.feature_extractor, self.audio_token_id, self.audio = None, -1, audio or AudioConfig()
        if self.family.audio_pad:
            from transformers import WhisperFeatureExtractor

            self.feature_extractor = WhisperFeatureExtractor.from_pretrained(model_path)
            self.audio_token_id = int(self.config.audio_token_id)

    # -- rollout side
    def encode(self, text: str, media: dict[str, list[Any]] | None) -> Encoded:
        """`text` (the chat-templated prompt) with its placeholders expanded, and the tensors of
        `media` (`{"image": [items], "audio": [items]}`, each in placeholder order)."""
        media = {k: list(v) for k, v in (media or {}).items() if v}
        unsupported = sorted(set(media) - set(self.family.modalities))
        if unsupported:
            raise MediaError(f"{', '.join(unsupported)} inputs are not supported by model type "
                             f"{model_type(self.config)!r} (it takes {' and '.join(self.family.modalities)})")
        for modality in self.family.modalities:  # before any item is decoded
            have, want = text.count(PLACEHOLDERS[modality]), len(media.get(modality, []))
            if have != want:
                raise MediaError(f"the prompt has {have} {PLACEHOLDERS[modality]} placeholder(s) for {want} "
                                 f"{modality}(s); put one placeholder per {modality} in the content")
        request = self.request_fields(media)
        tensors = self.request_media_tensors(request.get("image_data"), request.get("audio_data"))
        spans = {m: self._spans(m, tensors) for m in self.family.modalities}
        return Encoded(self.tokenizer.encode(self._expand(text, spans), add_special_tokens=False), tensors, request)

    def request_fields(self, media: dict[str, list[Any]]) -> dict[str, list[str]]:
        """/generate's media fields of `media`: `image_data` (PNG data URIs), `audio_data` (float
        WAV data URIs at the feature extractor's rate), each only when there are items."""
        request = {}
        if media.get("image"):
            request["image_data"] = [image_to_data_uri(item) for item in media["image"]]
        if media.get("audio"):
            if self.feature_extractor is None:
                raise MediaError(f"audio inputs are not supported by model type {model_type(self.config)!r}")
            rate = int(self.feature_extractor.sampling_rate)
            request["audio_data"] = [audio_to_data_uri(self.waveform(item, self.audio), rate)
                                     for item in media["audio"]]
        return request

    def _spans(self, modality: str, tensors: dict[str, Any]) -> list[str]:
        """Each item's expansion `<open><pad>*n<close>`, in order."""
        f = self.family
        if modality == "image":
            return [f.image_open + f.image_pad * n + f.image_close for n in self.image_token_counts(tensors)]
        return [f.audio_open + f.audio_pad * n + f.audio_close for n in self.audio_token_counts(tensors)]

    @staticmethod
    def _expand(text: str, spans: dict[str, list[str]]) -> str:
        """`text` with its k-th `<image>` / `<audio>` replaced by that modality's k-th span (one
        pass: an expansion is never searched for placeholders)."""
        import re

        names = {PLACEHOLDERS[m]: m for m in spans}
        left = {m: iter(v) for m, v in spans.items()}
        return re.sub("|".join(re.escape(p) for p in names), lambda m: next(left[names[m.group(0)]]), text)

    # -- both sides
    def image_tensors(self, items: Sequence[Any]) -> dict[str, Any]:
        """`pixel_values` and `image_grid_thw` of image items (data URIs, paths, bytes, PIL, ...)."""
        from relax.utils.multimodal.image import to_pil

        if not items:
            return {}
        out = self.image_processor(images=[to_pil(item) for item in items], return_tensors="pt")
        return {"pixel_values": out["pixel_values"], "image_grid_thw": out["image_grid_thw"]}

    def image_token_counts(self, tensors: dict[str, Any]) -> list[int]:
        grid = tensors.get("image_grid_thw")
        return [] if grid is None else [int(n) // (self.merge ** 2) for n in grid.prod(-1).tolist()]

    def waveform(self, item: Any, cfg: AudioConfig) -> Any:
        """An audio item as float32 [T] at the feature extractor's rate; a bare array is taken to
        be at `cfg.sample_rate` (--audio-sample-rate), a WAV or struct at its own rate."""
        from relax.utils.multimodal.audio import AudioPipeline

        rate = int(self.feature_extractor.sampling_rate)
        if hasattr(item, "shape"):
            item = {"array": item, "sampling_rate": cfg.sample_rate}
        out = AudioPipeline(AudioConfig(sample_rate=rate, max_seconds=cfg.max_seconds)).process(item)
        if out.waveform.shape[0] < self.feature_extractor.n_fft:
            raise MediaError(f"audio of {out.waveform.shape[0]} samples at {rate} Hz is shorter than one feature "
                             f"window ({self.feature_extractor.n_fft} samples)")
        return out.waveform

    def audio_tensors(self, items: Sequence[Any]) -> dict[str, Any]:
        """`input_features [N, mel, F]` and `feature_attention_mask [N, F]` of audio items (each
        through the feature extractor alone, then padded to the longest: `collate`)."""
        if not items:
            return {}
        rate = int(self.feature_extractor.sampling_rate)
        rows = []
        for item in items:
            out = self.feature_extractor(self.waveform(item, AudioConfig(sample_rate=rate)).numpy(),
                                         sampling_rate=rate, padding=True, truncation=False,
                                         return_attention_mask=True, return_tensors="pt")
            rows.append({"input_features": out["input_features"], "feature_attention_mask": out["attention_mask"]})
        return collate(rows)

    def audio_token_counts(self, tensors: dict[str, Any]) -> list[int]:
        mask = tensors.get("feature_attention_mask")
        return [] if mask is None else [int(n) for n in self.family.audio_tokens(mask.sum(-1), self.config)]

    # -- engine side
    def request_media_tensors(self, image_data: Sequence[Any] | None, audio_data: Sequence[Any] | None
                              ) -> dict[str, Any]:
        tensors = self.image_tensors(list(image_data or []))
        if audio_data:
            if self.feature_extractor is None:
                raise MediaError(f"audio_data is not supported by model type {model_type(self.config)!r} "
                                 "(it takes image_data)")
            tensors.update(self.audio_tensors(list(audio_data)))
        return tensors

    def request_tensors(self, input_ids: Sequence[int], image_data: Sequence[Any] | None,
                        audio_data: Sequence[Any] | None = None) -> dict[str, Any]:
        """The encoder tensors of one /generate item, checked against its ids: the ids must hold
        exactly the pad tokens the images and audios expand to (the rollout's `encode` makes them so)."""
        tensors = self.request_media_tensors(image_data, audio_data)
        for name, token_id, want in (("image", self.image_token_id, sum(self.image_token_counts(tensors))),
                                     ("audio", self.audio_token_id, sum(self.audio_token_counts(tensors)))):
            have = sum(1 for t in input_ids if t == token_id)
            if want != have:
                raise MediaError(f"input_ids hold {have} {name} pad token(s) (id {token_id}) but {name}_data "
                                 f"expands to {want}: expand each {name}'s placeholder to its processor token "
                                 "count, as relax.utils.multimodal.processor.MultimodalProcessor.encode does")
        return tensors


def _take(per_item: list[int], used: int, pads: int, what: str, b: int) -> int:
    """How many items (from `used` on) a row's `pads` pad tokens use up."""
    while pads > 0:
        if used >= len(per_item):
            raise ValueError(f"row {b} has more {what} pad tokens than its tensors describe")
        pads, used = pads - per_item[used], used + 1
    return used


def rope_positions(model: Any, ids_BL: Any, mask_BL: Any, tensors: dict[str, Any]) -> Any:
    """M-RoPE position ids `(3, B, L)` from the model's own `get_rope_index` (text tokens count
    1, 2, 3, ...; an image's tokens take (t, h, w) grid positions; an audio's count on). `mask_BL`
    marks real tokens (left or right padding; padded positions get 0). Row by row, on each row's
    real tokens and its own media (the `image_grid_thw` rows and audios its pad tokens use up, in
    order): the same call the engine makes for one unpadded row, whatever padding the batch has."""
    import torch

    config = model.config
    family = FAMILIES[model_type(config)]
    merge = int(config.vision_config.spatial_merge_size)
    grids = tensors.get("image_grid_thw")
    per_image = [] if grids is None else [int(n) // merge ** 2 for n in grids.prod(-1).tolist()]
    mask = tensors.get("feature_attention_mask")
    frames = None if mask is None else mask.sum(-1)
    per_audio = [] if frames is None else [int(n) for n in family.audio_tokens(frames, config)]
    audio_id = getattr(config, "audio_token_id", None)
    out = torch.zeros((3, *ids_BL.shape), dtype=torch.long, device=ids_BL.device)
    images = audios = 0
    for b in range(ids_BL.shape[0]):
        keep = mask_BL[b].bool()
        ids_1L = ids_BL[b, keep][None]
        first_image, first_audio = images, audios
        images = _take(per_image, images, int((ids_1L == config.image_token_id).sum()), "image", b)
        if audio_id is not None:
            audios = _take(per_audio, audios, int((ids_1L == audio_id).sum()), "audio", b)
        if images == first_image and audios == first_audio:  # a text row: 1-D positions in all three components
            out[:, b, keep] = torch.arange(ids_1L.shape[1], device=ids_BL.device)
            continue
        position_ids = family.rope_index(model, ids_1L, grids[first_image:images] if images > first_image else None,
                                         frames[first_audio:audios] if audios > first_audio else None)
        out[:, b, keep] = position_ids[:, 0].to(out.dtype)
    return out
