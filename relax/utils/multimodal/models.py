"""The supported multimodal model types, and what the engine and the trainers need of each model.

`FAMILIES` is the one registry of supported multimodal model types (a checkpoint's
`config.model_type` -> `Family`): how it lays out its media tokens (`<open><pad>*n<close>` per item),
its audio encoder's output-length rule, its `get_rope_index` call and the transformers auto class
that builds it. Around it, what the rollout's engine and the trainers do with such a model:
`load_model`, `decoder_layers` (for FSDP wrapping and recompute), `copy_processor_files` (an
export keeps the checkpoint's processor files) and `rope_positions`, the M-RoPE position ids of a
padded batch from the model's own `get_rope_index`, row by row, so the engine's and the trainer's
positions (and so log-probs) of a sample agree.

Kept apart from `processor.py` (placeholder expansion, encoder tensors): the trainers need the
model side only, not the tokenizer and image processor a `MultimodalProcessor` loads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable


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


# ---- M-RoPE positions of a padded batch ------------------------------------------------------

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
