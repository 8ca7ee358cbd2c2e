"""Multimodal context carry-over for multi-turn (agentic) rollouts.

A custom generate function that feeds environment observations back to the model appends them
to `sample.tokens` turn by turn. When an observation holds images (a screenshot, a cropped
view: `{"obs_str": "...<image>...", "multi_modal_data": {"image": [...]}}`), three things must
grow together, or the engine and the trainer see different inputs:

- the token ids: each `<image>` of the observation expanded to the model's media tokens;
- the engine's `image_data`: every image of the sample so far, in order (the next /generate
  sends the whole context);
- the trainer's `sample.multimodal_train_inputs`: the new images' encoder tensors concatenated
  after the earlier ones (`pixel_values` rows, `image_grid_thw` rows), in the same order as
  their pad tokens in `sample.tokens`.

`MediaContext` keeps them in step:

    ctx = MediaContext(processor, sample)             # after the prompt was encoded
    out = await post(url, {"input_ids": sample.tokens, **ctx.request(), ...})
    ids = ctx.observe("<|im_start|>user\\n<image>what now?<|im_end|>\\n...", [image])
    sample.tokens += ids; sample.loss_mask += [0] * len(ids)

`GenerateState(args).media(sample)` builds one for the run's processor (None for text runs).
"""

from __future__ import annotations

from typing import Any, Sequence

from relax.utils.multimodal.processor import image_to_data_uri


def merge_tensors(old: dict[str, Any] | None, new: dict[str, Any] | None) -> dict[str, Any] | None:
    """`old`'s encoder tensors followed by `new`'s, key by key (concatenated along dim 0)."""
    import torch

    if not new:
        return old
    if not old:
        return dict(new)
    return {k: torch.cat([old[k], new[k]]) if k in old and k in new else old.get(k, new.get(k))
            for k in {*old, *new}}


class MediaContext:
    """The growing media of one multi-turn sample (see the module doc)."""

    def __init__(self, processor: Any, sample: Any) -> None:
        self.processor, self.sample = processor, sample
        images = list((sample.multimodal_inputs or {}).get("image") or [])
        self.image_data = [image_to_data_uri(item) for item in images]

    def request(self) -> dict[str, list[str]]:
        """The media fields of the next /generate request (every image so far)."""
        return {"image_data": list(self.image_data)} if self.image_data else {}

    def observe(self, text: str, images: Sequence[Any] = ()) -> list[int]:
        """Token ids of an observation `text` whose `<image>` placeholders stand for `images`;
        the images join the sample's media and its trainer tensors."""
        images = list(images)
        encoded = self.processor.encode(text, {"image": images} if images else None)
        if images:
            inputs = dict(self.sample.multimodal_inputs or {})
            inputs["image"] = list(inputs.get("image") or []) + images
            self.sample.multimodal_inputs = inputs
            self.sample.multimodal_train_inputs = merge_tensors(self.sample.multimodal_train_inputs, encoded.tensors)
            self.image_data += encoded.request["image_data"]
        return encoded.input_ids
