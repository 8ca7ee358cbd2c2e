"""The model side of multimodal inputs, shared by the rollout, the `hf` engine and the trainers.

One prompt with `<image>` / `<audio>` placeholders and its media become (1) token ids in which
each placeholder is expanded to the model's own media tokens (`<|vision_start|>` + one
`<|image_pad|>` per merged patch + `<|vision_end|>` for Qwen-VL), and (2) the tensors the model's
encoders take (`pixel_values`, `image_grid_thw`, ...). The rollout sends the ids and the media
(SGLang's `image_data`) to the engine, which recomputes the tensors from the media with the same
processor and checks they match the ids; the trainers get the rollout's tensors through
TransferQueue (`to_bytes` / `from_bytes`: safetensors, no pickle on the data plane). Positions
(M-RoPE: temporal, height, width) come from the model's own `get_rope_index` in every one of
them (`rope_positions`), so the engine's and the trainer's log-probs of a sample agree.

Why not `AutoProcessor`: the Qwen-VL processor classes also build a video processor, which needs
torchvision; this expansion is the processors' rule (one pad token per `merge_size**2` patches of
`image_grid_thw`), built from the checkpoint's image processor and tokenizer, which load anywhere.

`FAMILIES` is the one registry of supported multimodal model types. Failures are `MediaError`
(a bad item, a placeholder/item count mismatch), naming what to fix.
"""

from __future__ import annotations

import base64
import io
from dataclasses import dataclass, field
from typing import Any, Sequence

from relax.utils.multimodal.sources import MediaError

PLACEHOLDERS = {"image": "<image>", "video": "<video>", "audio": "<audio>"}


@dataclass(frozen=True)
class Family:
    """How one model type lays out its media tokens."""

    image_pad: str             # the token repeated once per merged image patch
    image_open: str            # around the pads: `<open><pad>*n<close>`
    image_close: str
    loader: str = "AutoModelForImageTextToText"  # the transformers auto class that builds it


QWEN_VL = Family(image_pad="<|image_pad|>", image_open="<|vision_start|>", image_close="<|vision_end|>")
FAMILIES: dict[str, Family] = {
    "qwen2_5_vl": QWEN_VL,
    "qwen3_vl": QWEN_VL,
    "qwen3_vl_moe": QWEN_VL,
}
MEDIA_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")


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
    where each starts). Rows without media add nothing."""
    import torch

    keys = sorted({k for r in rows if r for k in r})
    return {k: torch.cat([r[k] for r in rows if r and k in r]) for k in keys}


# ---- the processor -----------------------------------------------------------------------------

@dataclass
class Encoded:
    """One prompt's model inputs: `input_ids` (placeholders expanded), the encoder `tensors`, and
    the request fields for SGLang's /generate (`image_data`: PNG data URIs)."""

    input_ids: list[int]
    tensors: dict[str, Any] = field(default_factory=dict)
    request: dict[str, list[str]] = field(default_factory=dict)


class MultimodalProcessor:
    """Placeholder expansion and encoder tensors for one checkpoint (see the module doc)."""

    def __init__(self, model_path: str, tokenizer: Any = None) -> None:
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
        self.media_token_ids = sorted({vocab[t] for t in MEDIA_TOKENS if t in vocab})

    # -- rollout side
    def encode(self, text: str, media: dict[str, list[Any]] | None) -> Encoded:
        """`text` (the chat-templated prompt) with its placeholders expanded, and the tensors of
        `media` (`{"image": [items]}`, in placeholder order)."""
        media = {k: list(v) for k, v in (media or {}).items() if v}
        unsupported = sorted(set(media) - {"image"})
        if unsupported:
            raise MediaError(f"{', '.join(unsupported)} inputs are not supported by model type "
                             f"{model_type(self.config)!r} (it takes images)")
        images = media.get("image", [])
        pieces = text.split(PLACEHOLDERS["image"])
        if len(pieces) - 1 != len(images):
            raise MediaError(f"the prompt has {len(pieces) - 1} {PLACEHOLDERS['image']} placeholder(s) for "
                             f"{len(images)} image(s); put one placeholder per image in the content")
        if not images:
            return Encoded(self.tokenizer.encode(text, add_special_tokens=False))
        uris = [image_to_data_uri(item) for item in images]
        tensors = self.image_tensors(uris)
        counts = self.image_token_counts(tensors)
        expanded = pieces[0]
        for n, piece in zip(counts, pieces[1:]):
            expanded += self.family.image_open + self.family.image_pad * n + self.family.image_close + piece
        ids = self.tokenizer.encode(expanded, add_special_tokens=False)
        return Encoded(ids, tensors, {"image_data": uris})

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

    # -- engine side
    def request_tensors(self, input_ids: Sequence[int], image_data: Sequence[Any] | None) -> dict[str, Any]:
        """The encoder tensors of one /generate item, checked against its ids: the ids must hold
        exactly the pad tokens the images expand to (the rollout's `encode` makes them so)."""
        tensors = self.image_tensors(list(image_data or []))
        want = sum(self.image_token_counts(tensors))
        have = sum(1 for t in input_ids if t == self.image_token_id)
        if want != have:
            raise MediaError(f"input_ids hold {have} image pad token(s) (id {self.image_token_id}) but image_data "
                             f"expands to {want}: expand each image's placeholder to its processor token count, "
                             "as relax.utils.multimodal.processor.MultimodalProcessor.encode does")
        return tensors


def rope_positions(model: Any, ids_BL: Any, mask_BL: Any, tensors: dict[str, Any]) -> Any:
    """M-RoPE position ids `(3, B, L)` from the model's own `get_rope_index` (text tokens count
    1, 2, 3, ...; an image's tokens take (t, h, w) grid positions). `mask_BL` marks real tokens
    (left or right padding; padded positions get 0). Row by row, on each row's real tokens and
    its own images (the `image_grid_thw` rows its pad tokens use up, in order): the same call the
    engine makes for one unpadded row, whatever padding the batch has."""
    import torch

    config = model.config
    merge = int(config.vision_config.spatial_merge_size)
    grids = tensors.get("image_grid_thw")
    per_image = [] if grids is None else [int(n) // merge ** 2 for n in grids.prod(-1).tolist()]
    out = torch.zeros((3, *ids_BL.shape), dtype=torch.long, device=ids_BL.device)
    used = 0
    for b in range(ids_BL.shape[0]):
        keep = mask_BL[b].bool()
        ids_1L = ids_BL[b, keep][None]
        pads, first = int((ids_1L == config.image_token_id).sum()), used
        while pads > 0:
            if used >= len(per_image):
                raise ValueError(f"row {b} has more image pad tokens than image_grid_thw describes")
            pads, used = pads - per_image[used], used + 1
        if used == first:  # a text row: 1-D positions in all three components
            out[:, b, keep] = torch.arange(ids_1L.shape[1], device=ids_BL.device)
            continue
        types_1L = (ids_1L == config.image_token_id).to(torch.int32)
        position_ids, _ = model.model.get_rope_index(ids_1L, types_1L, image_grid_thw=grids[first:used])
        out[:, b, keep] = position_ids[:, 0]
    return out
