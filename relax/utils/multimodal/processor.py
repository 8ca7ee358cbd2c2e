"""The model side of multimodal inputs, shared by the rollout, the `hf` engine and the trainers.

One prompt with `<image>` / `<audio>` placeholders and its media become (1) token ids in which
each placeholder is expanded to the model's own media tokens (`<|vision_start|>` + one
`<|image_pad|>` per merged patch + `<|vision_end|>` for Qwen-VL; `<|audio_start|>` + one
`<|audio_pad|>` per audio-encoder output + `<|audio_end|>` for Qwen3-Omni), and (2) the tensors
the model's encoders take (`pixel_values`, `image_grid_thw`, `input_features`,
`feature_attention_mask`). The rollout sends the ids and the media (SGLang's `image_data`,
`audio_data`) to the engine, which recomputes the tensors from the media with the same processor
and checks they match the ids; the trainers get the rollout's tensors through TransferQueue
(`tensors.to_bytes` / `from_bytes`: safetensors, no pickle on the data plane). Positions (M-RoPE:
temporal, height, width) come from the model's own `get_rope_index` in every one of them
(`models.rope_positions`), so the engine's and the trainer's log-probs of a sample agree.

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

This module is the processor itself; its parts live beside it: `models` (the `FAMILIES`
registry of supported model types, loading, M-RoPE positions), `video_processor` (a video item's
frames, timestamps and patch rows), `items` (media through the pipelines and into /generate's
data URIs) and `tensors` (the data plane's byte format, collation). Failures are `MediaError`
(a bad item, a placeholder/item count mismatch), naming what to fix.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from relax.utils.multimodal.audio_in_video import audio_order, interleave
from relax.utils.multimodal.config import AudioConfig
from relax.utils.multimodal.items import (PIPELINE_ITEM, audio_to_data_uri, image_to_data_uri, keep_audio,
                                          video_to_request)
from relax.utils.multimodal.models import AUDIO_TOKENS, FAMILIES, MEDIA_TOKENS, model_type
from relax.utils.multimodal.sources import MediaError
from relax.utils.multimodal.tensors import collate
from relax.utils.multimodal.video_processor import VideoSettings, patchify_video, slice_times, video_item


PLACEHOLDERS = {"image": "<image>", "video": "<video>", "audio": "<audio>"}


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
        return keep_audio(PIPELINE_ITEM["video"](VideoPipeline(cfg).process(item)), item)

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
