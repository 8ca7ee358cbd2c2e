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

from relax.utils.multimodal.audio_in_video import audio_order, interleave
from relax.utils.multimodal.config import AudioConfig
from relax.utils.multimodal.sources import MediaError

PLACEHOLDERS = {"image": "<image>", "video": "<video>", "audio": "<audio>"}
DEFAULT_VIDEO_FPS = 2.0  # the rate of a bare frame list (the --video-fps default: frames are sampled at it)


def submodule(model: Any, name: str) -> Any:
    """`model.model.<name>` (transformers >= 5.2x's layout) or `model.<name>` (older releases put a
    thinker's towers and `get_rope_index` on the top-level model)."""
    body = getattr(model, "model", None)
    return getattr(body, name) if body is not None and hasattr(body, name) else getattr(model, name)


@dataclass
class RowMedia:
    """One row's share of a batch's media tensors, for its `get_rope_index` call (None: none)."""

    images: Any = None    # image_grid_thw rows [n, 3]
    videos: Any = None    # video_grid_thw rows [n, 3]
    seconds: Any = None   # seconds per temporal grid of each video [n] (families with `video_seconds`)
    audio_frames: Any = None  # feature frames of each audio [n]
    audio_in_video: bool = False  # its videos carry their audio tracks (--use-audio-in-video)


def _vl_rope_index(model: Any, ids_1L: Any, media: RowMedia) -> Any:
    """Qwen2.5-VL / Qwen3-VL `get_rope_index` on one unpadded row -> `(3, 1, L)`. Token types: 1
    image pad, 2 video pad (Qwen3-VL's frames are separate groups: timestamps lie between them)."""
    import torch

    config = model.config
    types_1L = (ids_1L == config.image_token_id).to(torch.int32)
    types_1L[ids_1L == getattr(config, "video_token_id", -1)] = 2
    extra = {} if media.seconds is None else {"second_per_grid_ts": media.seconds}
    videos = None if media.videos is None else media.videos.clone()
    return submodule(model, "get_rope_index")(ids_1L, types_1L, image_grid_thw=media.images,
                                              video_grid_thw=videos, **extra)[0]


def _omni_rope_index(model: Any, ids_1L: Any, media: RowMedia) -> Any:
    """Qwen3-Omni thinker `get_rope_index` on one unpadded row -> `(3, 1, L)`: audio tokens take
    consecutive positions (`audio_seqlens`: each audio's feature frames), images a (t, h, w) grid,
    videos a grid whose time steps are `seconds x position_id_per_seconds` apart, a video with its
    audio track the two interleaved by time (`audio_in_video.py`)."""
    position_ids, _ = submodule(model, "get_rope_index")(
        ids_1L, image_grid_thw=media.images, video_grid_thw=media.videos,
        attention_mask=ids_1L.new_ones(ids_1L.shape), use_audio_in_video=media.audio_in_video,
        audio_seqlens=media.audio_frames, second_per_grids=media.seconds)
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
    rope_index: Callable[..., Any] = _vl_rope_index  # (model, ids_1L, RowMedia) -> (3, 1, L)
    video_pad: str | None = "<|video_pad|>"  # one per merged patch of every temporal slice (open/close: the image's)
    video_timestamps: bool = False  # Qwen3-VL: each temporal slice is `<t seconds>` + open + pads + close
    video_seconds: str | None = None  # the forward kwarg holding each video's seconds per temporal grid
    audio_pad: str | None = None    # None: the model takes no audio
    audio_open: str | None = None
    audio_close: str | None = None
    audio_tokens: Callable[..., Any] | None = None  # (feature frames [N], config) -> pad tokens [N]
    loader: str = "AutoModelForImageTextToText"  # the transformers auto class that builds it

    @property
    def modalities(self) -> tuple[str, ...]:
        return ("image",) + (("video",) if self.video_pad else ()) + (("audio",) if self.audio_pad else ())


_VISION = dict(image_pad="<|image_pad|>", image_open="<|vision_start|>", image_close="<|vision_end|>")
QWEN2_5_VL = Family(**_VISION, video_seconds="second_per_grid_ts")
QWEN3_VL = Family(**_VISION, video_timestamps=True)
QWEN3_OMNI = Family(**_VISION, rope_index=_omni_rope_index, video_seconds="video_second_per_grid",
                    audio_pad="<|audio_pad|>", audio_open="<|audio_start|>", audio_close="<|audio_end|>",
                    audio_tokens=_qwen3_omni_audio_tokens)
FAMILIES: dict[str, Family] = {
    "qwen2_5_vl": QWEN2_5_VL,
    "qwen3_vl": QWEN3_VL,
    "qwen3_vl_moe": QWEN3_VL,
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


def video_to_request(item: Any) -> dict[str, Any]:
    """A video item as /generate's `video_data` entry: `{"frames": [PNG data URIs], "fps": f}` (its
    frames as given, lossless, and their rate)."""
    frames, fps, _ = video_item(item)
    return {"frames": [image_to_data_uri(frame) for frame in frames], "fps": fps}


def video_item(item: Any) -> tuple[list[Any], float, list[float]]:
    """(frames, fps, each frame's time in seconds) of a video item as the processor takes it: frames
    already sampled and sized (the video pipeline's work): `{"frames": [...], "fps": f,
    "frame_times": [...]}` (fps and times optional) or a bare frame list / uint8 [T, H, W, 3]
    array, whose frames are taken to be `DEFAULT_VIDEO_FPS` apart."""
    if isinstance(item, dict) and "frames" in item:
        frames, fps, times = item["frames"], item.get("fps") or DEFAULT_VIDEO_FPS, item.get("frame_times")
    elif isinstance(item, (list, tuple)) or (hasattr(item, "shape") and len(item.shape) == 4):
        frames, fps, times = item, DEFAULT_VIDEO_FPS, None
    else:
        raise MediaError(f"a video item must be a list of frames or {{'frames': [...], 'fps': <fps>}}, got "
                         f"{type(item).__name__} (video files go through the video pipeline first)")
    frames = [frames[i] for i in range(len(frames))]
    if not frames:
        raise MediaError("a video item has no frames")
    if not isinstance(fps, (int, float)) or isinstance(fps, bool) or fps <= 0:
        raise MediaError(f"video fps must be a positive number, got {fps!r}")
    times = [i / fps for i in range(len(frames))] if times is None else [float(t) for t in times]
    if len(times) != len(frames):
        raise MediaError(f"a video item has {len(frames)} frames but {len(times)} frame_times")
    return frames, float(fps), times


def slice_times(frame_times: Sequence[float], temporal_patch: int) -> list[float]:
    """The time of each temporal slice (`temporal_patch` frames, the last frame repeated to fill the
    final one): the mean of its first and last frame's times (Qwen3-VL's timestamps)."""
    times = list(frame_times)
    times += [times[-1]] * (-len(times) % temporal_patch)
    return [(times[i] + times[i + temporal_patch - 1]) / 2 for i in range(0, len(times), temporal_patch)]


def patchify_video(frames_THWC: Any, settings: VideoSettings) -> tuple[Any, tuple[int, int, int]]:
    """uint8 frames [T, H, W, 3] -> (`pixel_values_videos` rows [t*h*w, 3*tp*p*p], (t, h, w)), the Qwen-VL
    video processor's layout: rescaled and normalised, T padded to a multiple of the temporal patch
    `tp` with the last frame, patches ordered merge window by merge window (an image is a video of
    `tp` equal frames)."""
    import torch

    p, tp, m = settings.patch_size, settings.temporal_patch_size, settings.merge_size
    x = torch.as_tensor(frames_THWC).permute(0, 3, 1, 2).to(torch.float32) * settings.rescale_factor
    mean = torch.tensor(settings.mean, dtype=torch.float32)[None, :, None, None]
    std = torch.tensor(settings.std, dtype=torch.float32)[None, :, None, None]
    x = (x - mean) / std
    if x.shape[0] % tp:
        x = torch.cat([x, x[-1:].expand(tp - x.shape[0] % tp, -1, -1, -1)])
    t, c, height, width = x.shape[0] // tp, x.shape[1], x.shape[2], x.shape[3]
    h, w = height // p, width // p
    x = x.reshape(t, tp, c, h // m, m, p, w // m, m, p).permute(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return x.reshape(t * h * w, c * tp * p * p), (t, h, w)


@dataclass(frozen=True)
class VideoSettings:
    """The checkpoint's video processor settings (`video_preprocessor_config.json`, else its image
    processor's: Qwen2.5-VL keeps one file for both)."""

    patch_size: int
    temporal_patch_size: int
    merge_size: int
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    rescale_factor: float

    @classmethod
    def load(cls, model_path: str, image_processor: Any) -> VideoSettings:
        import json
        import os

        cfg: dict[str, Any] = {}
        path = os.path.join(model_path, "video_preprocessor_config.json")
        if os.path.isfile(path):
            with open(path) as f:
                cfg = json.load(f)

        def get(name: str, default: Any = None) -> Any:
            return cfg.get(name, getattr(image_processor, name, default))

        return cls(patch_size=int(get("patch_size")), temporal_patch_size=int(get("temporal_patch_size", 2)),
                   merge_size=int(get("merge_size")), mean=tuple(float(v) for v in get("image_mean")),
                   std=tuple(float(v) for v in get("image_std")), rescale_factor=float(get("rescale_factor", 1 / 255)))


_PIPELINE_ITEM: dict[str, Callable[[Any], Any]] = {
    "image": lambda p: p.pixels,
    "video": lambda p: {"frames": p.frames, "fps": p.sampled_fps, "frame_times": p.frame_times},
    "audio": lambda p: {"array": p.waveform, "sampling_rate": p.sample_rate},
}


def through_pipelines(media: dict[str, Sequence[Any]] | None, pipelines: dict[str, Any] | None
                      ) -> dict[str, list[Any]]:
    """A row's media (`{"image": [items], ...}`) through the flags' pipelines, in the forms
    `MultimodalProcessor.encode` takes: images resized (uint8 [H, W, 3]), videos sampled and sized
    (`{"frames", "fps", "frame_times"}`), audio resampled (`{"array", "sampling_rate"}`). A
    modality without a pipeline passes as it is."""
    out = {k: list(v) for k, v in (media or {}).items() if v}
    for modality, pipeline in (pipelines or {}).items():
        if out.get(modality):
            out[modality] = [_PIPELINE_ITEM[modality](pipeline.process(item)) for item in out[modality]]
            if modality == "video":
                out["video"] = [keep_audio(v, item) for v, item in zip(out["video"], media["video"])]
    return out


def keep_audio(processed: dict[str, Any], item: Any) -> dict[str, Any]:
    """A sampled video keeps where its audio track is, for --use-audio-in-video: a frame-list item's
    `"audio"`, or the video file itself (`"audio_source"`, decoded only when the flag asks)."""
    if isinstance(item, dict) and "frames" in item:
        if item.get("audio") is not None:
            processed["audio"] = item["audio"]
    elif not isinstance(item, (list, tuple)) and not hasattr(item, "shape"):
        processed["audio_source"] = item
    return processed


PROCESSOR_FILES = ("preprocessor_config.json", "video_preprocessor_config.json", "processor_config.json",
                   "chat_template.json", "chat_template.jinja")


def copy_processor_files(src: str, out: str) -> list[str]:
    """Copy a checkpoint's processor files (image / video processor, feature extractor, chat
    template) to an export next to it; returns those copied."""
    import os
    import shutil

    copied = [name for name in PROCESSOR_FILES if os.path.isfile(os.path.join(src, name))]
    for name in copied:
        shutil.copyfile(os.path.join(src, name), os.path.join(out, name))
    return copied


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
    `audio`: the audio flags (`--audio-sample-rate`: the rate of bare waveform items);
    `use_audio_in_video`: each video's audio track heard with its frames (Omni; `audio_in_video.py`)."""

    def __init__(self, model_path: str, tokenizer: Any = None, audio: AudioConfig | None = None,
                 use_audio_in_video: bool = False) -> None:
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
        self.video = VideoSettings.load(model_path, self.image_processor)
        vocab = self.tokenizer.get_vocab()
        # Media placeholders the model must never emit as text (the engine does not sample them).
        self.media_token_ids = sorted({vocab[t] for t in MEDIA_TOKENS + AUDIO_TOKENS if t in vocab})
        self.feature_extractor, self.audio_token_id, self.audio = None, -1, audio or AudioConfig()
        if self.family.audio_pad:
            from transformers import WhisperFeatureExtractor

            self.feature_extractor = WhisperFeatureExtractor.from_pretrained(model_path)
            self.audio_token_id = int(self.config.audio_token_id)
        if use_audio_in_video and not (self.family.audio_pad and self.family.video_pad):
            raise MediaError(f"--use-audio-in-video: model type {model_type(self.config)!r} has no audio encoder; "
                             "it needs an Omni model (qwen3_omni_moe_thinker)")
        self.use_audio_in_video = use_audio_in_video

    @classmethod
    def for_run(cls, model_path: str, tokenizer: Any, flags: Any) -> MultimodalProcessor:
        """The processor a run's data flags describe (--audio-sample-rate, --use-audio-in-video)."""
        return cls(model_path, tokenizer, AudioConfig.from_flags(flags),
                   use_audio_in_video=bool(getattr(flags, "use_audio_in_video", False)))

    def pipelines(self, flags: Any) -> dict[str, Any]:
        """The media flags' pipelines for this model (`through_pipelines`): images and video frames
        sized in its own units (patch x merge), audio resampled to --audio-sample-rate."""
        from relax.utils.multimodal import AudioPipeline, ImageConfig, ImagePipeline, VideoConfig, VideoPipeline

        units = dict(patch_size=self.video.patch_size, merge_size=self.video.merge_size)
        vision = self.config.vision_config
        return {"image": ImagePipeline(ImageConfig.from_flags(flags, patch_size=int(vision.patch_size),
                                                              merge_size=int(vision.spatial_merge_size))),
                "video": VideoPipeline(VideoConfig.from_flags(flags, **units)),
                "audio": AudioPipeline(AudioConfig.from_flags(flags))}

    # -- rollout side
    def encode(self, text: str, media: dict[str, list[Any]] | None) -> Encoded:
        """`text` (the chat-templated prompt) with its placeholders expanded, and the tensors of
        `media` (`{"image": [items], "video": [items], "audio": [items]}`, each in placeholder
        order; with --use-audio-in-video the videos' tracks join the audio, `audio_in_video.py`)."""
        media = {k: list(v) for k, v in (media or {}).items() if v}
        if media.get("video"):
            media["video"] = [self.as_frames(item) for item in media["video"]]
        unsupported = sorted(set(media) - set(self.family.modalities))
        if unsupported:
            raise MediaError(f"{', '.join(unsupported)} inputs are not supported by model type "
                             f"{model_type(self.config)!r} (it takes {' and '.join(self.family.modalities)})")
        for modality in self.family.modalities:  # before any item is decoded
            have, want = text.count(PLACEHOLDERS[modality]), len(media.get(modality, []))
            if have != want:
                raise MediaError(f"the prompt has {have} {PLACEHOLDERS[modality]} placeholder(s) for {want} "
                                 f"{modality}(s); put one placeholder per {modality} in the content")
        audios = media.get("audio", [])
        slots, in_video = list(range(len(audios))), None  # each <audio>'s index in the audio tensors
        if self.use_audio_in_video and media.get("video"):  # the videos' tracks join, in pad-token order
            audios, slots, in_video = audio_order(text, audios, media["video"])
        request = self.request_fields({**media, "audio": audios})
        tensors = self.request_media_tensors(request.get("image_data"), request.get("audio_data"),
                                             request.get("video_data"))
        spans = {m: self._spans(m, tensors, media.get(m, [])) for m in self.family.modalities if m != "audio"}
        counts = self.audio_token_counts(tensors)
        f = self.family
        if f.audio_pad:
            spans["audio"] = [f.audio_open + f.audio_pad * counts[i] + f.audio_close for i in slots]
        if in_video is not None:
            spans["video"] = [self._audio_video_span(tensors, k, counts[i]) for k, i in enumerate(in_video)]
        return Encoded(self.tokenizer.encode(self._expand(text, spans), add_special_tokens=False), tensors, request)

    def _audio_video_span(self, tensors: dict[str, Any], k: int, audio_tokens: int) -> str:
        """Video k with its audio: `<|vision_start|><|audio_start|>`, their pads interleaved by time,
        `<|audio_end|><|vision_end|>` (`audio_in_video.interleave`)."""
        f = self.family
        kinds = interleave(tensors["video_grid_thw"][k].tolist(), float(tensors[f.video_seconds][k]),
                           float(self.config.position_id_per_seconds), self.merge, audio_tokens)
        pads = "".join(f.video_pad if kind == "v" else f.audio_pad for kind in kinds)
        return f.image_open + f.audio_open + pads + f.audio_close + f.image_close

    def request_fields(self, media: dict[str, list[Any]]) -> dict[str, list[str]]:
        """/generate's media fields of `media`: `image_data` (PNG data URIs), `video_data` (`{"frames":
        [PNG data URIs], "fps"}` per video), `audio_data` (float WAV data URIs at the feature
        extractor's rate), each only when there are items."""
        request: dict[str, list[Any]] = {}
        if media.get("image"):
            request["image_data"] = [image_to_data_uri(item) for item in media["image"]]
        if media.get("video"):
            request["video_data"] = [video_to_request(item) for item in media["video"]]
        if media.get("audio"):
            if self.feature_extractor is None:
                raise MediaError(f"audio inputs are not supported by model type {model_type(self.config)!r}")
            rate = int(self.feature_extractor.sampling_rate)
            request["audio_data"] = [audio_to_data_uri(self.waveform(item, self.audio), rate)
                                     for item in media["audio"]]
        return request

    def _spans(self, modality: str, tensors: dict[str, Any], items: Sequence[Any]) -> list[str]:
        """Each image's or video's expansion `<open><pad>*n<close>`, in order (Qwen3-VL videos: one
        such block per temporal slice, each after its `<t seconds>` timestamp)."""
        f = self.family
        if modality == "image":
            return [f.image_open + f.image_pad * n + f.image_close for n in self.image_token_counts(tensors)]
        if modality == "video":
            spans = []
            for item, (t, h, w) in zip(items, tensors.get("video_grid_thw", []).tolist() if items else []):
                per_slice = h * w // self.merge ** 2
                if not f.video_timestamps:
                    spans.append(f.image_open + f.video_pad * (t * per_slice) + f.image_close)
                    continue
                times = slice_times(video_item(item)[2], self.video.temporal_patch_size)
                spans.append("".join(f"<{s:.1f} seconds>" + f.image_open + f.video_pad * per_slice + f.image_close
                                     for s in times[:t]))
            return spans
        raise ValueError(f"no spans for {modality!r} here (audio spans follow the audio order: encode)")

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

    def video_tensors(self, items: Sequence[Any]) -> dict[str, Any]:
        """`pixel_values_videos`, `video_grid_thw` (and the family's seconds per temporal grid) of video
        items, their frames used as given: all one size, each side a multiple of patch x merge (the
        video pipeline sizes them per --video-min/max-token-num)."""
        import numpy as np
        import torch

        from relax.utils.multimodal.image import to_pil

        if not items:
            return {}
        unit = self.video.patch_size * self.video.merge_size
        pixels, grids, seconds = [], [], []
        for k, item in enumerate(items):
            frames, fps, _ = video_item(self.as_frames(item))
            decoded = [np.asarray(to_pil(f, kind=f"video {k} frame {i}")) for i, f in enumerate(frames)]
            height, width = decoded[0].shape[:2]
            if any(f.shape[:2] != (height, width) for f in decoded) or height % unit or width % unit:
                raise MediaError(f"video {k}: frames must all be one size with sides multiples of {unit} pixels "
                                 f"(got {height}x{width}); send them through the video pipeline (the rollout "
                                 "sizes frames per --video-min/max-token-num)")
            rows, grid = patchify_video(np.stack(decoded), self.video)
            pixels.append(rows)
            grids.append(grid)
            seconds.append(self.video.temporal_patch_size / fps)
        out = {"pixel_values_videos": torch.cat(pixels), "video_grid_thw": torch.tensor(grids, dtype=torch.long)}
        if self.family.video_seconds:
            out[self.family.video_seconds] = torch.tensor(seconds, dtype=torch.float32)
        return out

    def as_frames(self, item: Any) -> Any:
        """A video file (path, URL, bytes, data URI) as `{"frames", "fps", "frame_times"}`, sampled and
        sized by the video pipeline at the default video flags in this model's units; frame lists
        pass as they are (already sampled and sized)."""
        if not isinstance(item, (str, bytes, bytearray)):
            return item
        from relax.utils.multimodal import VideoConfig, VideoPipeline

        cfg = VideoConfig(patch_size=self.video.patch_size, merge_size=self.video.merge_size)
        return keep_audio(_PIPELINE_ITEM["video"](VideoPipeline(cfg).process(item)), item)

    def video_token_counts(self, tensors: dict[str, Any]) -> list[int]:
        grid = tensors.get("video_grid_thw")
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
    def request_media_tensors(self, image_data: Sequence[Any] | None, audio_data: Sequence[Any] | None,
                              video_data: Sequence[Any] | None = None) -> dict[str, Any]:
        tensors = self.image_tensors(list(image_data or []))
        if video_data:
            if not self.family.video_pad:
                raise MediaError(f"video_data is not supported by model type {model_type(self.config)!r}")
            tensors.update(self.video_tensors(list(video_data)))
        if audio_data:
            if self.feature_extractor is None:
                raise MediaError(f"audio_data is not supported by model type {model_type(self.config)!r} "
                                 "(it takes image_data)")
            tensors.update(self.audio_tensors(list(audio_data)))
        return tensors

    def request_tensors(self, input_ids: Sequence[int], image_data: Sequence[Any] | None,
                        audio_data: Sequence[Any] | None = None, video_data: Sequence[Any] | None = None
                        ) -> dict[str, Any]:
        """The encoder tensors of one /generate item, checked against its ids: the ids must hold
        exactly the pad tokens the images, videos and audios expand to (the rollout's `encode` makes
        them so)."""
        tensors = self.request_media_tensors(image_data, audio_data, video_data)
        for name, token_id, want in (("image", self.image_token_id, sum(self.image_token_counts(tensors))),
                                     ("video", self.video_token_id, sum(self.video_token_counts(tensors))),
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


def _audio_in_video(config: Any, ids_L: Any, b: int) -> bool:
    """Whether row b's videos carry their audio (`<|vision_start|><|audio_start|>` blocks); a row
    cannot mix them with plain videos (the model's `get_rope_index` takes one or the other)."""
    start, audio_start = getattr(config, "vision_start_token_id", None), getattr(config, "audio_start_token_id", None)
    if start is None or audio_start is None or ids_L.shape[0] < 2:
        return False
    after_start = ids_L[1:][ids_L[:-1] == start]
    with_audio = bool((after_start == audio_start).any())
    if with_audio and bool((after_start == config.video_token_id).any()):
        raise ValueError(f"row {b} mixes videos with and without their audio tracks; with --use-audio-in-video "
                         "every video of a prompt carries its audio")
    return with_audio


def rope_positions(model: Any, ids_BL: Any, mask_BL: Any, tensors: dict[str, Any]) -> Any:
    """M-RoPE position ids `(3, B, L)` from the model's own `get_rope_index` (text tokens count
    1, 2, 3, ...; an image's tokens take (t, h, w) grid positions, a video's too with its time
    steps; an audio's count on). `mask_BL` marks real tokens (left or right padding; padded
    positions get 0). Row by row, on each row's real tokens and its own media (the grid rows and
    audios its pad tokens use up, in order): the same call the engine makes for one unpadded row,
    whatever padding the batch has."""
    import torch

    config = model.config
    family = FAMILIES[model_type(config)]
    merge = int(config.vision_config.spatial_merge_size)
    images, videos = tensors.get("image_grid_thw"), tensors.get("video_grid_thw")
    seconds = tensors.get(family.video_seconds) if family.video_seconds else None
    mask = tensors.get("feature_attention_mask")
    frames = None if mask is None else mask.sum(-1)
    kinds = {  # kind -> (pad token id, pad tokens per item)
        "image": (config.image_token_id, [] if images is None else [int(n) // merge ** 2 for n in images.prod(-1)]),
        "video": (getattr(config, "video_token_id", None),
                  [] if videos is None else [int(n) // merge ** 2 for n in videos.prod(-1)]),
        "audio": (getattr(config, "audio_token_id", None),
                  [] if frames is None else [int(n) for n in family.audio_tokens(frames, config)]),
    }
    used = dict.fromkeys(kinds, 0)
    out = torch.zeros((3, *ids_BL.shape), dtype=torch.long, device=ids_BL.device)
    for b in range(ids_BL.shape[0]):
        keep = mask_BL[b].bool()
        ids_1L = ids_BL[b, keep][None]
        first = dict(used)
        for kind, (token_id, per_item) in kinds.items():
            if token_id is not None:
                used[kind] = _take(per_item, used[kind], int((ids_1L == token_id).sum()), kind, b)
        if used == first:  # a text row: 1-D positions in all three components
            out[:, b, keep] = torch.arange(ids_1L.shape[1], device=ids_BL.device)
            continue

        def mine(t: Any, kind: str) -> Any:
            return t[first[kind]:used[kind]] if t is not None and used[kind] > first[kind] else None

        row = RowMedia(images=mine(images, "image"), videos=mine(videos, "video"), seconds=mine(seconds, "video"),
                       audio_frames=mine(frames, "audio"), audio_in_video=_audio_in_video(config, ids_1L[0], b))
        out[:, b, keep] = family.rope_index(model, ids_1L, row)[:, 0].to(out.dtype)
    return out
