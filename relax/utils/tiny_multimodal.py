"""Tiny vision-language checkpoints built from scratch (no model hub), for CPU runs and tests.

`build_tiny_vl(kind, tokenizer, out_dir)` writes an ordinary HF checkpoint of a randomly
initialised Qwen2.5-VL or Qwen3-VL (config.json, safetensors, tokenizer with the Qwen media
tokens, the image processor's preprocessor_config.json), loadable with
`AutoModelForImageTextToText`, `AutoTokenizer` and `AutoImageProcessor` like a real one. The
vision tower is as small as the architecture allows: a few blocks over 14x14 (Qwen2.5-VL) or
16x16 (Qwen3-VL) patches, merged 2x2 into one LLM token.
"""

from __future__ import annotations

import os
from typing import Any

from relax.utils.multimodal.processor import MEDIA_TOKENS

KINDS = ("qwen2_5_vl", "qwen3_vl")


def add_media_tokens(tokenizer: Any) -> Any:
    """Add the Qwen media tokens (`<|vision_start|>`, `<|image_pad|>`, ...) as special tokens."""
    known = set(tokenizer.get_vocab())
    new = [t for t in MEDIA_TOKENS if t not in known]
    if new:
        tokenizer.add_special_tokens({"additional_special_tokens": new}, replace_extra_special_tokens=False)
    return tokenizer


def _config(kind: str, tokenizer: Any, *, hidden_size: int, num_layers: int, num_heads: int,
            vision_hidden: int, vision_depth: int, max_position_embeddings: int) -> Any:
    from transformers import Qwen2_5_VLConfig, Qwen3VLConfig

    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in MEDIA_TOKENS}
    head_dim = hidden_size // num_heads
    half = head_dim // 2  # M-RoPE splits each head's rotary half into temporal / height / width sections
    section = [half - 2 * (half // 3), half // 3, half // 3]
    text = dict(vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=num_heads,
                head_dim=head_dim, max_position_embeddings=max_position_embeddings,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": section},
                tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                bos_token_id=None)
    common = dict(image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
                  vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
                  tie_word_embeddings=True)
    if kind == "qwen2_5_vl":
        vision = dict(depth=vision_depth, hidden_size=vision_hidden, intermediate_size=2 * vision_hidden,
                      num_heads=2, out_hidden_size=hidden_size, patch_size=14, spatial_merge_size=2,
                      temporal_patch_size=2, window_size=56, fullatt_block_indexes=[vision_depth - 1])
        return Qwen2_5_VLConfig(text_config=text, vision_config=vision, **common)
    if kind == "qwen3_vl":
        text["rope_parameters"]["mrope_interleaved"] = True
        vision = dict(depth=vision_depth, hidden_size=vision_hidden, intermediate_size=2 * vision_hidden,
                      num_heads=2, out_hidden_size=hidden_size, patch_size=16, spatial_merge_size=2,
                      temporal_patch_size=2, num_position_embeddings=64, deepstack_visual_indexes=[0])
        return Qwen3VLConfig(text_config=text, vision_config=vision, **common)
    raise ValueError(f"unknown tiny VL kind {kind!r}; choose one of {KINDS}")


def build_tiny_vl(kind: str, tokenizer: Any, out_dir: str, *, hidden_size: int = 64, num_layers: int = 2,
                  num_heads: int = 4, vision_hidden: int = 32, vision_depth: int = 2,
                  max_position_embeddings: int = 1024, min_tokens: int = 4, max_tokens: int = 64,
                  seed: int = 0) -> str:
    """Write a random tiny `kind` VL checkpoint with `tokenizer` (media tokens added) to `out_dir`.

    The image processor keeps images within [min_tokens, max_tokens] LLM tokens."""
    import torch
    from transformers import AutoModelForImageTextToText, Qwen2VLImageProcessorPil

    add_media_tokens(tokenizer)
    config = _config(kind, tokenizer, hidden_size=hidden_size, num_layers=num_layers, num_heads=num_heads,
                     vision_hidden=vision_hidden, vision_depth=vision_depth,
                     max_position_embeddings=max_position_embeddings)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForImageTextToText.from_config(config, dtype=torch.float32)
    patch = config.vision_config.patch_size
    unit = (patch * 2) ** 2  # pixels per LLM token (patch x 2x2 merge)
    image_processor = Qwen2VLImageProcessorPil(patch_size=patch, merge_size=2, temporal_patch_size=2,
                                               min_pixels=min_tokens * unit, max_pixels=max_tokens * unit)
    if kind == "qwen3_vl":  # Qwen3-VL normalises to [-1, 1]
        image_processor.image_mean, image_processor.image_std = [0.5] * 3, [0.5] * 3
    os.makedirs(out_dir, exist_ok=True)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.bos_token_id = None
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    image_processor.save_pretrained(out_dir)
    return out_dir
