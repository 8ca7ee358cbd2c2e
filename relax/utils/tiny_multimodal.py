"""Tiny vision-language and omni checkpoints built from scratch (no model hub), for CPU runs and tests.

`build_tiny_vl(kind, tokenizer, out_dir)` writes an ordinary HF checkpoint of a randomly
initialised Qwen2.5-VL or Qwen3-VL (config.json, safetensors, tokenizer with the Qwen media
tokens, the image processor's preprocessor_config.json), loadable with
`AutoModelForImageTextToText`, `AutoTokenizer` and `AutoImageProcessor` like a real one. The
vision tower is as small as the architecture allows: a few blocks over 14x14 (Qwen2.5-VL) or
16x16 (Qwen3-VL) patches, merged 2x2 into one LLM token. `tiny_vl_config` is its config alone.

`build_tiny_omni(tokenizer, out_dir)` writes a Qwen3-Omni thinker (audio + image + text; a MoE
language model with a few tiny experts) the same way, loadable with `AutoModelForImageTextToText`;
its preprocessor_config.json holds both the image processor and the WhisperFeatureExtractor
(128 mel bins, 16 kHz, 10 ms hops), as a real Omni checkpoint's does.
"""

from __future__ import annotations

import os
from typing import Any

from relax.utils.multimodal.models import AUDIO_TOKENS, MEDIA_TOKENS, submodule

KINDS = ("qwen2_5_vl", "qwen3_vl")


def add_media_tokens(tokenizer: Any, tokens: tuple[str, ...] = MEDIA_TOKENS) -> Any:
    """Add the Qwen media tokens (`<|vision_start|>`, `<|image_pad|>`, ...) as special tokens."""
    known = set(tokenizer.get_vocab())
    new = [t for t in tokens if t not in known]
    if new:
        tokenizer.add_special_tokens({"additional_special_tokens": new}, replace_extra_special_tokens=False)
    return tokenizer


def _text_config(tokenizer: Any, hidden_size: int, num_layers: int, num_heads: int, max_position_embeddings: int,
                 vocab_multiple: int = 1) -> dict[str, Any]:
    head_dim = hidden_size // num_heads
    half = head_dim // 2  # M-RoPE splits each head's rotary half into temporal / height / width sections
    section = [half - 2 * (half // 3), half // 3, half // 3]
    vocab = -(-len(tokenizer) // vocab_multiple) * vocab_multiple  # padded, as real checkpoints pad theirs
    return dict(vocab_size=vocab, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=num_heads,
                head_dim=head_dim, max_position_embeddings=max_position_embeddings,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": section},
                tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                bos_token_id=None)


def _config(kind: str, tokenizer: Any, *, hidden_size: int, num_layers: int, num_heads: int,
            vision_hidden: int, vision_depth: int, max_position_embeddings: int, vocab_multiple: int = 1) -> Any:
    from transformers import Qwen2_5_VLConfig, Qwen3VLConfig

    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in MEDIA_TOKENS}
    text = _text_config(tokenizer, hidden_size, num_layers, num_heads, max_position_embeddings, vocab_multiple)
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


def tiny_vl_config(kind: str, tokenizer: Any, *, hidden_size: int = 64, num_layers: int = 2, num_heads: int = 4,
                   vision_hidden: int = 32, vision_depth: int = 2, max_position_embeddings: int = 1024,
                   vocab_multiple: int = 1) -> Any:
    """The HF config of `build_tiny_vl`'s checkpoint (the media tokens are added to `tokenizer`), with no
    weights: what a dry run reads."""
    add_media_tokens(tokenizer)
    return _config(kind, tokenizer, hidden_size=hidden_size, num_layers=num_layers, num_heads=num_heads,
                   vision_hidden=vision_hidden, vision_depth=vision_depth,
                   max_position_embeddings=max_position_embeddings, vocab_multiple=vocab_multiple)


def build_tiny_vl(kind: str, tokenizer: Any, out_dir: str, *, hidden_size: int = 64, num_layers: int = 2,
                  num_heads: int = 4, vision_hidden: int = 32, vision_depth: int = 2,
                  max_position_embeddings: int = 1024, min_tokens: int = 4, max_tokens: int = 64,
                  seed: int = 0, vocab_multiple: int = 1) -> str:
    """Write a random tiny `kind` VL checkpoint with `tokenizer` (media tokens added) to `out_dir`.

    The image processor keeps images within [min_tokens, max_tokens] LLM tokens; the vocabulary
    is padded to a multiple of `vocab_multiple` (tensor parallelism splits it)."""
    import torch
    from transformers import AutoModelForImageTextToText, Qwen2VLImageProcessorPil

    config = tiny_vl_config(kind, tokenizer, hidden_size=hidden_size, num_layers=num_layers, num_heads=num_heads,
                            vision_hidden=vision_hidden, vision_depth=vision_depth,
                            max_position_embeddings=max_position_embeddings, vocab_multiple=vocab_multiple)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForImageTextToText.from_config(config, dtype=torch.float32)
    patch = config.vision_config.patch_size
    unit = (patch * 2) ** 2  # pixels per LLM token (patch x 2x2 merge)
    image_processor = Qwen2VLImageProcessorPil(patch_size=patch, merge_size=2, temporal_patch_size=2,
                                               min_pixels=min_tokens * unit, max_pixels=max_tokens * unit)
    if kind == "qwen3_vl":  # Qwen3-VL normalises to [-1, 1]
        image_processor.image_mean, image_processor.image_std = [0.5] * 3, [0.5] * 3
    return _save(model, tokenizer, out_dir, image_processor)


def _save(model: Any, tokenizer: Any, out_dir: str, *processors: Any) -> str:
    """Write the checkpoint; several processors share preprocessor_config.json (merged, as in a
    real Omni checkpoint: each class reads its own keys)."""
    import json

    os.makedirs(out_dir, exist_ok=True)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.bos_token_id = None
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    merged: dict[str, Any] = {}
    for processor in processors:
        processor.save_pretrained(out_dir)
        with open(os.path.join(out_dir, "preprocessor_config.json")) as f:
            merged.update(json.load(f))
    with open(os.path.join(out_dir, "preprocessor_config.json"), "w") as f:
        json.dump(merged, f, indent=2, sort_keys=True)
    return out_dir


def build_tiny_omni(tokenizer: Any, out_dir: str, *, hidden_size: int = 64, num_layers: int = 2, num_heads: int = 4,
                    num_experts: int = 4, encoder_hidden: int = 32, encoder_depth: int = 2,
                    max_position_embeddings: int = 2048, min_tokens: int = 4, max_tokens: int = 64,
                    seed: int = 0, vocab_multiple: int = 1) -> str:
    """Write a random tiny Qwen3-Omni thinker with `tokenizer` (image and audio tokens added) to
    `out_dir`. Images keep within [min_tokens, max_tokens] LLM tokens; audio is 16 kHz, 128 mel
    bins, and the audio encoder's window is the real one (`n_window` 50: 13 tokens per second);
    the vocabulary is padded to a multiple of `vocab_multiple`."""
    import torch
    from transformers import (AutoModelForImageTextToText, Qwen2VLImageProcessorPil, Qwen3OmniMoeThinkerConfig,
                              WhisperFeatureExtractor)

    add_media_tokens(tokenizer, MEDIA_TOKENS + AUDIO_TOKENS)
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in MEDIA_TOKENS + AUDIO_TOKENS}
    text = _text_config(tokenizer, hidden_size, num_layers, num_heads, max_position_embeddings, vocab_multiple)
    text["rope_parameters"]["mrope_interleaved"] = True
    text.update(tie_word_embeddings=False, moe_intermediate_size=hidden_size // 2, num_experts=num_experts,
                num_experts_per_tok=2)
    audio = dict(num_mel_bins=128, encoder_layers=encoder_depth, encoder_attention_heads=2,
                 encoder_ffn_dim=2 * encoder_hidden, d_model=encoder_hidden, output_dim=hidden_size, n_window=50,
                 n_window_infer=100, downsample_hidden_size=16)
    vision = dict(depth=encoder_depth, hidden_size=encoder_hidden, intermediate_size=2 * encoder_hidden, num_heads=2,
                  out_hidden_size=hidden_size, patch_size=16, spatial_merge_size=2, temporal_patch_size=2,
                  num_position_embeddings=64, deepstack_visual_indexes=[0])
    config = Qwen3OmniMoeThinkerConfig(
        text_config=text, audio_config=audio, vision_config=vision, audio_token_id=ids["<|audio_pad|>"],
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        audio_start_token_id=ids["<|audio_start|>"], vision_start_token_id=ids["<|vision_start|>"],
        audio_end_token_id=ids["<|audio_end|>"], vision_end_token_id=ids["<|vision_end|>"], position_id_per_seconds=13)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForImageTextToText.from_config(config, dtype=torch.float32)
        # He init for the audio front end (the real checkpoint's trained convolutions keep the
        # mel content well above the sinusoidal positions they are added to): at std 0.02 three
        # convolutions shrink the features ~1e4-fold, and the encoder's output is its positions alone.
        tower = submodule(model, "audio_tower")
        for layer, gain in ((tower.conv2d1, "relu"), (tower.conv2d2, "relu"), (tower.conv2d3, "relu"),
                            (tower.conv_out, "linear")):
            torch.nn.init.kaiming_normal_(layer.weight, nonlinearity=gain)
            if layer.bias is not None:
                torch.nn.init.zeros_(layer.bias)
    unit = (16 * 2) ** 2  # pixels per LLM token (patch x 2x2 merge)
    image_processor = Qwen2VLImageProcessorPil(patch_size=16, merge_size=2, temporal_patch_size=2,
                                               min_pixels=min_tokens * unit, max_pixels=max_tokens * unit,
                                               image_mean=[0.5] * 3, image_std=[0.5] * 3)
    features = WhisperFeatureExtractor(feature_size=128, sampling_rate=16000, hop_length=160, chunk_length=30,
                                       n_fft=400, return_attention_mask=True)
    return _save(model, tokenizer, out_dir, image_processor, features)
