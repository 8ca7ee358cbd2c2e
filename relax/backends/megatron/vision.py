"""Vision-language and omni models on the megatron backend: the checkpoint's media encoders
(Qwen2.5-VL's and Qwen3-VL's vision tower; the Qwen3-Omni thinker's vision and audio towers)
beside a megatron-core language model.

- The language model is a megatron-core `GPTModel` built from the checkpoint's `text_config` with
  M-RoPE (`position_embedding_type="mrope"`, its `mrope_section`; Qwen3-VL's and Qwen3-Omni's
  interleaved layout through `model.InterleavedMRoPE`); its weights convert like a Qwen2
  (Qwen2.5-VL), Qwen3 (Qwen3-VL) or Qwen3-MoE (the Omni thinker) model's (`convert.py`), so
  tensor, sequence, data (and for the MoE one expert) parallelism work as for text models.
- Each encoder (`TOWERS`: `visual`, `audio_tower`) is the checkpoint's own transformers module
  with the checkpoint's weights, whole on every rank (a few hundred million weights for real
  models: replicated, not split). It is trained by the same optimizer (or frozen with
  --freeze-params-name-list visual / audio_tower); as a replicated weight its gradient is averaged
  over the data-parallel ranks, and every tensor rank computes the same one (the decoder's input
  gradient is complete on each of them).
- A micro-batch with media: the decoder's input is the word embeddings of its tokens with each
  image / video / audio pad token's row replaced by its encoder's output for it, in order, as the
  HF model's forward does (`embed`); under --sequence-parallel the embeddings are gathered whole
  for that and scattered again. Positions (`3 x B x L`, temporal / height / width) come from the
  HF model's own `get_rope_index` (`relax.utils.multimodal.models.rope_positions`), called on a
  copy of the HF model on the meta device (no weights), so they are the engines' and the fsdp
  trainer's positions. Text rows get 0, 1, 2, ... in all three.
- Deepstack (Qwen3-VL, Qwen3-Omni): the vision tower also returns features from some of its
  blocks; the k-th is added to the hidden states leaving decoder layer k at the image / video
  positions (a forward hook on that layer, reading the micro-batch's additions from
  `model.deepstack_adds`: it runs again, with the same additions, when activation recompute
  replays the layer in the backward pass).
- Names: checkpoints name the text weights `model.layers.*` (the original layout, what
  transformers writes) or `model.language_model.layers.*`, and an encoder `visual.*` or
  `model.visual.*` (`audio_tower.*` likewise); both are read. Weights go out under the HF model's
  in-memory names (what the engines' models call their parameters and what the fsdp trainer sends).

Not built (start-up errors): Qwen3-VL-MoE on this backend (its checkpoints keep the experts in
fused tensors the converter does not read), and media under pipeline or context parallelism.
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator

import torch

from relax.backends.megatron.convert import ConversionError, Layout, megatron_to_hf

SUPPORTED = ("qwen2_5_vl", "qwen3_vl", "qwen3_omni_moe_thinker")
# encoder (its HF submodule's name, and its parameters' prefix on the megatron model) -> its config's attribute
TOWERS = {"visual": "vision_config", "audio_tower": "audio_config"}
TOWER_PREFIXES = tuple(f"{t}." for t in TOWERS)
_VISION_MEDIA = (("image_token_id", "pixel_values", "image_grid_thw"),
                 ("video_token_id", "pixel_values_videos", "video_grid_thw"))


def check_supported(hf_config: Any, pp: int, cp: int) -> None:
    """Clear start-up errors for what this module does not build."""
    model_type = getattr(hf_config, "model_type", None)
    if model_type not in SUPPORTED:
        raise ConversionError(f"model_type {model_type!r}: the megatron backend trains the vision-language models "
                              f"{', '.join(SUPPORTED)} (Qwen3-VL-MoE is not built); use --train-backend fsdp")
    if pp > 1 or cp > 1:
        raise ConversionError(f"a vision-language model on the megatron backend runs without pipeline and context "
                              f"parallelism (got --pipeline-model-parallel-size {pp}, --context-parallel-size {cp}); "
                              "use tensor / data parallelism, or --train-backend fsdp")


def tower_of(hf_name: str) -> str | None:
    """The encoder an HF name belongs to (either layout: `visual.x` or `model.visual.x`), or None."""
    for tower in TOWERS:
        if hf_name.startswith((f"{tower}.", f"model.{tower}.")):
            return tower
    return None


def split_state(hf_state: dict[str, torch.Tensor]
                ) -> tuple[dict[str, torch.Tensor], dict[str, dict[str, torch.Tensor]]]:
    """A VL / omni checkpoint's tensors -> (the language model's under text-model names `model.*` /
    `lm_head.*`, each encoder's under its own module names)."""
    text: dict[str, torch.Tensor] = {}
    towers: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in hf_state.items():
        tower = tower_of(name)
        if tower is not None:
            towers.setdefault(tower, {})[name.split(f"{tower}.", 1)[1]] = tensor
        elif name.startswith("model.language_model."):
            text["model." + name[len("model.language_model."):]] = tensor
        else:
            text[name] = tensor
    return text, towers


class VisionSide:
    """The HF half of a VL / omni model on the megatron backend (see the module doc): the
    encoders, the positions and the names."""

    def __init__(self, hf_config: Any) -> None:
        from transformers import AutoModelForImageTextToText

        from relax.utils.multimodal.models import submodule

        self.config = hf_config
        with torch.device("meta"):  # the rope index and the module names; no weights
            self.hf = AutoModelForImageTextToText.from_config(hf_config)
        paths = {id(m): n for n, m in self.hf.named_modules()}
        self.text_prefix = _text_model_path(self.hf) + "."
        # encoder -> (its in-memory HF prefix, its class)
        self.towers = {t: (paths[id(submodule(self.hf, t))] + ".", type(submodule(self.hf, t)))
                       for t in TOWERS if getattr(hf_config, TOWERS[t], None) is not None}
        self.token_ids = {key: int(getattr(hf_config, key)) for key, _, _ in _VISION_MEDIA}
        self.audio_token_id = getattr(hf_config, "audio_token_id", None)
        self.deepstack = len(getattr(hf_config.vision_config, "deepstack_visual_indexes", None) or [])

    def install(self, model: Any) -> None:
        """Qwen3-VL: the deepstack hooks on the first decoder layers (module doc)."""
        model.deepstack_adds = None
        for k in range(self.deepstack):
            model.decoder.layers[k].register_forward_hook(_deepstack_hook(model, k))

    def build_towers(self, states: dict[str, dict[str, torch.Tensor]]) -> dict[str, torch.nn.Module]:
        """Each encoder with the checkpoint's weights (`split_state`'s second half)."""
        out = {}
        for tower, (_, cls) in self.towers.items():
            module = cls._from_config(getattr(self.config, TOWERS[tower]), dtype=torch.float32)
            result = module.load_state_dict(states.get(tower, {}), strict=False)
            if result.missing_keys or result.unexpected_keys:
                raise ConversionError(f"the checkpoint's {tower} does not fit {cls.__name__}: missing "
                                      f"{result.missing_keys[:4]}, unexpected {result.unexpected_keys[:4]}")
            out[tower] = module
        return out

    # -- a micro-batch
    def positions(self, ids_BL: torch.Tensor, mask_BL: torch.Tensor, media: dict[str, torch.Tensor]) -> torch.Tensor:
        """M-RoPE positions `[3, B, L]` (padding: 0)."""
        from relax.utils.multimodal.models import rope_positions

        return rope_positions(self.hf, ids_BL.cpu(), mask_BL.cpu(), {k: v.cpu() for k, v in media.items()}
                              ).to(ids_BL.device)

    def embed(self, model: Any, ids_BL: torch.Tensor, media: dict[str, torch.Tensor],
              sequence_parallel: bool) -> torch.Tensor:
        """The decoder's input `[L, B, H]` (`[L / TP, B, H]` under sequence parallelism): word
        embeddings, each media pad token's row replaced by the tower's output, in order."""
        from megatron.core import tensor_parallel

        emb_LBH = model.embedding(input_ids=ids_BL, position_ids=None)
        if sequence_parallel:  # whole sequences to place the features; the gradient comes back whole
            emb_LBH = tensor_parallel.gather_from_sequence_parallel_region(emb_LBH, tensor_parallel_output_grad=False)
        emb_BLH = emb_LBH.transpose(0, 1)

        def place(features: torch.Tensor, token_id: int, what: str) -> torch.Tensor:
            mask_BL1 = (ids_BL == token_id)[..., None]
            if int(mask_BL1.sum()) != features.shape[0]:
                raise ValueError(f"the micro-batch holds {int(mask_BL1.sum())} {what} pad tokens but its {what} "
                                 f"inputs give {features.shape[0]} features")
            return mask_BL1

        if "input_features" in media:  # audio: the thinker's get_audio_features, on the real frames only
            mask_NF = media["feature_attention_mask"].bool()
            frames = media["input_features"].permute(0, 2, 1)[mask_NF].permute(1, 0)
            tower = model.audio_tower
            out = tower(frames.to(next(tower.parameters()).dtype), feature_lens=mask_NF.sum(-1), return_dict=True)
            features = out.last_hidden_state
            emb_BLH = emb_BLH.masked_scatter(place(features, self.audio_token_id, "audio"), features.to(emb_BLH.dtype))
        adds_BLH = [emb_BLH.new_zeros(emb_BLH.shape) for _ in range(self.deepstack)]
        for token_key, pixels_key, grid_key in _VISION_MEDIA:
            if pixels_key not in media:
                continue
            tower = model.visual
            out = tower(media[pixels_key].to(next(tower.parameters()).dtype), grid_thw=media[grid_key])
            features, levels = _vision_outputs(out)
            mask_BL1 = place(features, self.token_ids[token_key], token_key.split("_")[0])
            emb_BLH = emb_BLH.masked_scatter(mask_BL1, features.to(emb_BLH.dtype))
            for k, level in enumerate(levels):
                adds_BLH[k] = adds_BLH[k].masked_scatter(mask_BL1, level.to(emb_BLH.dtype))
        emb_LBH = emb_BLH.transpose(0, 1).contiguous()
        adds = [a.transpose(0, 1).contiguous() for a in adds_BLH]
        if sequence_parallel:
            emb_LBH = tensor_parallel.scatter_to_sequence_parallel_region(emb_LBH)
            adds = [tensor_parallel.scatter_to_sequence_parallel_region(a) for a in adds]
        if self.deepstack:
            model.deepstack_adds = adds
        return emb_LBH

    # -- names
    def hf_name(self, text_name: str) -> str:
        """A text-model HF name (`model.layers.0...`, `lm_head.weight`) -> the VL model's in-memory name."""
        return self.text_prefix + text_name[len("model."):] if text_name.startswith("model.") else text_name

    def text_name(self, hf_name: str) -> str | None:
        """An HF name of the model (either layout) -> its text-model name; None for an encoder's."""
        if tower_of(hf_name) is not None:
            return None
        if hf_name.startswith(self.text_prefix):
            return "model." + hf_name[len(self.text_prefix):]
        return hf_name

    @staticmethod
    def tower_name(hf_name: str) -> str:
        """An HF name of an encoder (either layout) -> its parameter's name on the megatron model."""
        tower = tower_of(hf_name)
        return f"{tower}." + hf_name.split(f"{tower}.", 1)[1]

    def hf_tensors(self, named_full: Iterable[tuple[str, torch.Tensor]], layout: Layout
                   ) -> Iterator[tuple[str, torch.Tensor]]:
        """Full Megatron tensors (and the encoders', `visual.*`, `audio_tower.*`) -> the model's HF tensors."""
        for name, tensor in named_full:
            tower = tower_of(name)
            if tower is not None:
                yield self.towers[tower][0] + name[len(tower) + 1:], tensor
                continue
            for hf_name, t in megatron_to_hf(name, tensor, layout):
                yield self.hf_name(hf_name), t


def _text_model_path(model: Any) -> str:
    """Where the language model (its `embed_tokens` and `layers`) sits in the HF model:
    `model.language_model` (transformers >= 5.2x) or `model` (an Omni thinker on older releases)."""
    for name, module in model.named_modules():
        if hasattr(module, "embed_tokens") and hasattr(module, "layers") and tower_of(name + ".") is None:
            return name
    raise ConversionError(f"{type(model).__name__}: no language model (a module with embed_tokens and layers)")


def _vision_outputs(out: Any) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """(merged features, deepstack features) of a vision tower's output: a tensor (Qwen2.5-VL on
    older transformers), a (features, deepstack) tuple (the Omni thinker's tower on older
    transformers) or a model output with `pooler_output` (and `deepstack_features`)."""
    if isinstance(out, torch.Tensor):
        return out, []
    if isinstance(out, tuple):
        return out[0], list(out[1]) if len(out) > 1 and isinstance(out[1], (list, tuple)) else []
    return out.pooler_output, list(getattr(out, "deepstack_features", None) or [])


def _deepstack_hook(model: Any, k: int) -> Any:
    """Adds `model.deepstack_adds[k]` (`[L, B, H]`, zero off the media positions) to decoder layer
    k's output hidden states; nothing when the micro-batch has no media."""

    def hook(module: Any, args: Any, output: Any) -> Any:
        adds = model.deepstack_adds
        if adds is None:
            return output
        if isinstance(output, tuple):
            return (output[0] + adds[k].to(output[0].dtype), *output[1:])
        return output + adds[k].to(output.dtype)

    return hook
