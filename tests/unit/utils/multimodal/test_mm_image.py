"""Image pipeline: smart resize within the token bounds and the vision-token count."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from relax.config.schema import DataConfig
from relax.utils.multimodal import ImageConfig, ImagePipeline, MediaError
from relax.utils.multimodal.image import num_image_tokens, smart_resize


def png(width: int, height: int, color=(255, 0, 0)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (width, height), color).save(buf, format="PNG")
    return buf.getvalue()


def test_smart_resize_rounds_to_the_factor_inside_the_bounds():
    assert smart_resize(100, 200, factor=28, min_pixels=4 * 784, max_pixels=16384 * 784) == (112, 196)


def test_smart_resize_scales_down_to_max_pixels_and_up_to_min_pixels():
    h, w = smart_resize(1000, 1000, factor=28, min_pixels=4 * 784, max_pixels=64 * 784)
    assert (h, w) == (224, 224) and h * w <= 64 * 784
    h, w = smart_resize(10, 20, factor=28, min_pixels=16 * 784, max_pixels=16384 * 784)
    assert h % 28 == 0 and w % 28 == 0 and h * w >= 16 * 784


def test_resize_factor_zero_keeps_the_size_within_bounds():
    assert smart_resize(100, 200, factor=0, min_pixels=4 * 784, max_pixels=16384 * 784) == (100, 200)


def test_extreme_aspect_ratio_is_a_media_error():
    with pytest.raises(MediaError, match="aspect ratio"):
        smart_resize(1, 500, factor=28, min_pixels=4, max_pixels=10**9)


@pytest.mark.parametrize("max_tokens, expected", [(16384, 16 * 16), (64, 8 * 8), (16, 4 * 4)])
def test_image_tokens_follow_the_max_token_flag(max_tokens, expected):
    result = ImagePipeline(ImageConfig(max_tokens=max_tokens)).process(png(448, 448))
    assert result.num_tokens == expected
    assert tuple(result.pixels.shape) == (28 * int(expected ** 0.5),) * 2 + (3,)
    assert result.grid_thw == (1, 2 * int(expected ** 0.5), 2 * int(expected ** 0.5))


def test_image_tokens_follow_the_min_token_flag():
    small = png(28, 28)
    assert ImagePipeline(ImageConfig()).process(small).num_tokens == 4  # default min 4 tokens
    assert ImagePipeline(ImageConfig(min_tokens=64)).process(small).num_tokens == 64


def test_token_count_matches_pixels_over_28_squared():
    cfg = ImageConfig()
    result = ImagePipeline(cfg).process(png(300, 170))
    h, w, _ = result.pixels.shape
    assert result.num_tokens == h * w // 784 == num_image_tokens(h, w, cfg)


def test_flags_build_the_config_with_seed_defaults():
    cfg = ImageConfig.from_flags(DataConfig(image_max_token_num=256, image_resize_scale_factor=0))
    assert (cfg.min_tokens, cfg.max_tokens, cfg.resize_factor) == (4, 256, 0)


def test_bad_bounds_name_the_flag():
    with pytest.raises(ValueError, match="--image-min-token-num"):
        ImageConfig(min_tokens=100, max_tokens=10)


def test_corrupt_image_bytes_are_a_media_error():
    with pytest.raises(MediaError, match="not a decodable image"):
        ImagePipeline(ImageConfig()).process(b"\x89PNG not really")


def test_missing_image_file_names_the_path(tmp_path):
    missing = str(tmp_path / "nope.png")
    with pytest.raises(MediaError, match="nope.png.*cannot read"):
        ImagePipeline(ImageConfig()).process(missing)
