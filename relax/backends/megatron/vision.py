"""Vision-language models on the megatron backend: a Qwen2.5-VL or Qwen3-VL vision tower beside a
megatron-core language model.

- The language model is a megatron-core `GPTModel` built from the checkpoint's `text_config` with
  M-RoPE (`position_embedding_type="mrope"`, its `mrope_section`; Qwen3-VL's interleaved layout
  through `model.InterleavedMRoPE`); its weights convert like a Qwen2 (Qwen2.5-VL) or Qwen3
  (Qwen3-VL) model's (`convert.py`), so tensor parallelism, sequence parallelism and data
  parallelism work as for text models.
- The vision tower is the checkpoint's own transformers module (`model.visual`), with the
  checkpoint's weights, whole on every rank (a few hundred million weights for real Qwen2.5-VL
  models: replicated, not split). It is trained by the same optimizer (or frozen with
  --freeze-params-name-list visual); as a replicated weight its gradient is averaged over the
  data-parallel ranks, and every tensor rank computes the same one (the decoder's input gradient
  is complete on each of them).
- A micro-batch with media: the decoder's input is the word embeddings of its tokens with each
  image / video pad token's row replaced by the tower's output for it, in order, as the HF
  model's forward does (`embed`); under --sequence-parallel the embeddings are gathered whole for
  that and scattered again. Positions (`3 x B x L`, temporal / height / width) come from the HF
  model's own `get_rope_index` (`relax.utils.multimodal.processor.rope_positions`), called on a
  copy of the HF model on the meta device (no weights), so they are the engines' and the fsdp
  trainer's positions. Text rows get 0, 1, 2, ... in all three.
- Qwen3-VL's deepstack: the tower also returns features from some of its blocks; the k-th is
  added to the hidden states leaving decoder layer k at the media positions (a forward hook on
  that layer, reading the micro-batch's additions from `model.deepstack_adds`: it runs again,
  with the same additions, when activation recompute replays the layer in the backward pass).
- Names: checkpoints name the text weights `model.layers.*` (the original layout, what
  transformers writes) or `model.language_model.layers.*`, and the tower `visual.*` or
  `model.visual.*`; both are read. Weights go out under the HF model's in-memory names (what the
  engines' models call their parameters and what the fsdp trainer sends).

Not built (start-up errors): Qwen3-VL-MoE and the Omni thinker on this backend (their MoE
language models keep their experts in fused HF tensors the converter does not read), and media
under pipeline or context parallelism.
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator

import torch

from relax.backends.megatron.convert import ConversionError, Layout, megatron_to_hf

SUPPORTED = ("qwen2_5_vl", "qwen3_vl")
VISUAL = "visual."  # the tower's parameters on the megatron model: `visual.<its own names>`
_MEDIA = (("image_token_id", "pixel_values", "image_grid_thw"),
          ("video_token_id", "pixel_values_videos", "video_grid_thw"))


def check_supported(hf_config: Any, pp: int, cp: int) -> None:
    """Clear start-up errors for what this module does not build."""
    model_type = getattr(hf_config, "model_type", None)
    if model_type not in SUPPORTED:
        raise ConversionError(f"model_type {model_type!r}: the megatron backend trains the vision-language models "
                              f"{', '.join(SUPPORTED)} (the MoE ones, Qwen3-VL-MoE and the Omni thinker, are "
                              "not built); use --train-backend fsdp")
    if pp > 1 or cp > 1:
        raise ConversionError(f"a vision-language model on the megatron backend runs without pipeline and context "
                              f"parallelism (got --pipeline-model-parallel-size {pp}, --context-parallel-size {cp}); "
                              "use tensor / data parallelism, or --train-backend fsdp")


def split_state(hf_state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """A VL checkpoint's tensors -> (the language model's under text-model names `model.*` /
    `lm_head.*`, the tower's under its own module names)."""
    text, visual = {}, {}
    for name, tensor in hf_state.items():
        if name.startswith(("visual.", "model.visual.")):
            visual[name.split("visual.", 1)[1]] = tensor
        elif name.startswith("model.language_model."):
            text["model." + name[len("model.language_model."):]] = tensor
        else:
            text[name] = tensor
    return text, visual


class VisionSide:
    """The HF half of a VL model on the megatron backend (see the module doc): the tower, the
    positions and the names."""

    def __init__(self, hf_config: Any) -> None:
        from transformers import AutoModelForImageTextToText

        from relax.utils.multimodal.processor import submodule

        self.config = hf_config
        with torch.device("meta"):  # the rope index and the module names; no weights
            self.hf = AutoModelForImageTextToText.from_config(hf_config)
        paths = {id(m): n for n, m in self.hf.named_modules()}
        self.visual_prefix = paths[id(submodule(self.hf, "visual"))] + "."
        self.text_prefix = paths[id(submodule(self.hf, "language_model"))] + "."
        self.visual_cls = type(submodule(self.hf, "visual"))
        self.token_ids = {key: int(getattr(hf_config, key)) for key, _, _ in _MEDIA}
        self.deepstack = len(getattr(hf_config.vision_config, "deepstack_visual_indexes", None) or [])

    def install(self, model: Any) -> None:
        """Qwen3-VL: the deepstack hooks on the first decoder layers (module doc)."""
        model.deepstack_adds = None
        for k in range(self.deepstack):
            model.decoder.layers[k].register_forward_hook(_deepstack_hook(model, k))

    def build_visual(self, state: dict[str, torch.Tensor]) -> torch.nn.Module:
        """The tower with the checkpoint's weights (`split_state`'s second half)."""
        visual = self.visual_cls._from_config(self.config.vision_config, dtype=torch.float32)
        result = visual.load_state_dict(state, strict=False)
        if result.missing_keys or result.unexpected_keys:
            raise ConversionError(f"the checkpoint's vision tower does not fit {self.visual_cls.__name__}: missing "
                                  f"{result.missing_keys[:4]}, unexpected {result.unexpected_keys[:4]}")
        return visual

    # -- a micro-batch
    def positions(self, ids_BL: torch.Tensor, mask_BL: torch.Tensor, media: dict[str, torch.Tensor]) -> torch.Tensor:
        """M-RoPE positions `[3, B, L]` (padding: 0)."""
        from relax.utils.multimodal.processor import rope_positions

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
        tower = model.visual
        adds_BLH = [emb_BLH.new_zeros(emb_BLH.shape) for _ in range(self.deepstack)]
        for token_key, pixels_key, grid_key in _MEDIA:
            if pixels_key not in media:
                continue
            out = tower(media[pixels_key].to(next(tower.parameters()).dtype), grid_thw=media[grid_key])
            features = out if isinstance(out, torch.Tensor) else out.pooler_output
            mask_BL1 = (ids_BL == self.token_ids[token_key])[..., None]
            if int(mask_BL1.sum()) != features.shape[0]:
                raise ValueError(f"the micro-batch holds {int(mask_BL1.sum())} {token_key.split('_')[0]} pad tokens "
                                 f"but its {pixels_key} give {features.shape[0]} features")
            emb_BLH = emb_BLH.masked_scatter(mask_BL1, features.to(emb_BLH.dtype))
            for k, level in enumerate(getattr(out, "deepstack_features", None) or []):
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
        """An HF name of the VL model (either layout) -> its text-model name; None for the tower's."""
        if hf_name.startswith(("visual.", self.visual_prefix)):
            return None
        if hf_name.startswith(self.text_prefix):
            return "model." + hf_name[len(self.text_prefix):]
        return hf_name

    def visual_name(self, hf_name: str) -> str:
        """An HF name of the tower (either layout) -> its parameter's name on the megatron model."""
        return VISUAL + hf_name.split("visual.", 1)[1]

    def hf_tensors(self, named_full: Iterable[tuple[str, torch.Tensor]], layout: Layout
                   ) -> Iterator[tuple[str, torch.Tensor]]:
        """Full Megatron tensors (and the tower's, `visual.*`) -> the VL model's HF tensors."""
        for name, tensor in named_full:
            if name.startswith(VISUAL):
                yield self.visual_prefix + name[len(VISUAL):], tensor
                continue
            for hf_name, t in megatron_to_hf(name, tensor, layout):
                yield self.hf_name(hf_name), t


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
