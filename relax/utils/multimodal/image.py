"""Image pipeline: a media item -> an RGB image resized as Qwen-VL's processor does -> its vision tokens.

Algorithm (qwen-vl-utils `smart_resize`, also in transformers' Qwen2-VL image processor):
1. round height and width to the nearest multiple of the alignment factor (at least one factor);
2. if that exceeds `max_pixels`, scale both sides down by sqrt(h*w / max_pixels) and floor to
   the factor; if it is below `min_pixels`, scale up by sqrt(min_pixels / (h*w)) and ceil;
3. the encoder cuts the result into `patch_size` patches, merges `merge_size^2` of them into one
   LLM token: tokens = (H / patch) * (W / patch) / merge^2 = H * W / 28^2 for Qwen2/2.5-VL.

`--image-resize-scale-factor` sets the alignment of the pre-resize done here (0: only the pixel
bounds apply, no rounding); the token count always uses the processor's own alignment
(patch * merge), so it is what the model will see whatever the pre-resize did.
Simplification: the aspect-ratio limit (200) is checked, the processor's rescale/normalise
steps are not done here (they do not change the token count).
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from typing import Any

from relax.utils.multimodal.config import ImageConfig
from relax.utils.multimodal.sources import MediaError, describe, read_bytes

MAX_ASPECT_RATIO = 200


def smart_resize(height: int, width: int, *, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """(height, width) resized into [min_pixels, max_pixels], sides multiples of `factor` (0: unaligned)."""
    if min(height, width) < 1:
        raise MediaError(f"image of size {height}x{width} is empty")
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise MediaError(f"image of size {height}x{width}: aspect ratio over {MAX_ASPECT_RATIO}")
    if factor == 0:
        return _scale_unaligned(height, width, min_pixels, max_pixels)
    h_bar = max(factor, round(height / factor) * factor)
    w_bar = max(factor, round(width / factor) * factor)
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def _scale_unaligned(height: int, width: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    pixels = height * width
    if pixels > max_pixels:
        beta = math.sqrt(pixels / max_pixels)
        return max(1, math.floor(height / beta)), max(1, math.floor(width / beta))
    if pixels < min_pixels:
        beta = math.sqrt(min_pixels / pixels)
        return math.ceil(height * beta), math.ceil(width * beta)
    return height, width


@dataclass(frozen=True)
class ProcessedImage:
    pixels: Any               # uint8 tensor [H, W, 3], already resized
    grid_thw: tuple[int, int, int]  # (1, H/patch, W/patch) as the processor reports `image_grid_thw`
    num_tokens: int           # LLM tokens the `<image>` placeholder expands to


def vision_grid(height: int, width: int, cfg: ImageConfig) -> tuple[int, int, int]:
    """The processor's (t, h, w) patch grid for an image of this size (its own smart_resize first)."""
    h, w = smart_resize(height, width, factor=cfg.unit, min_pixels=cfg.min_pixels, max_pixels=cfg.max_pixels)
    return 1, h // cfg.patch_size, w // cfg.patch_size


def num_image_tokens(height: int, width: int, cfg: ImageConfig) -> int:
    _, gh, gw = vision_grid(height, width, cfg)
    return gh * gw // cfg.merge_size ** 2


def to_pil(item: Any, kind: str = "image") -> Any:
    """A PIL RGB image from an item: PIL image, uint8 array/tensor [H, W, 3], or any `read_bytes` form."""
    import numpy as np
    from PIL import Image, UnidentifiedImageError

    if isinstance(item, Image.Image):
        return item.convert("RGB")
    if hasattr(item, "shape") and len(item.shape) == 3:  # numpy array or torch tensor [H, W, 3]
        array = item.numpy() if hasattr(item, "numpy") else item
        return Image.fromarray(np.asarray(array, dtype=np.uint8)).convert("RGB")
    data = read_bytes(item, kind)
    try:
        with Image.open(io.BytesIO(data)) as image:
            return image.convert("RGB")
    except (UnidentifiedImageError, OSError, ValueError) as exc:  # PIL raises these for truncated/garbage files
        raise MediaError(f"{kind} {describe(item)}: not a decodable image ({exc})") from exc


class ImagePipeline:
    """item -> ProcessedImage, per `ImageConfig` (see the module docstring)."""

    def __init__(self, cfg: ImageConfig) -> None:
        self.cfg = cfg

    def resized_size(self, height: int, width: int) -> tuple[int, int]:
        cfg = self.cfg
        return smart_resize(height, width, factor=cfg.resize_factor, min_pixels=cfg.min_pixels,
                            max_pixels=cfg.max_pixels)

    def process(self, item: Any) -> ProcessedImage:
        import numpy as np
        import torch
        from PIL import Image

        image = to_pil(item)
        height, width = self.resized_size(image.height, image.width)
        if (height, width) != (image.height, image.width):
            image = image.resize((width, height), Image.Resampling.BICUBIC)
        pixels = torch.from_numpy(np.asarray(image).copy())  # [H, W, 3] uint8
        grid = vision_grid(height, width, self.cfg)
        return ProcessedImage(pixels=pixels, grid_thw=grid, num_tokens=grid[1] * grid[2] // self.cfg.merge_size ** 2)
