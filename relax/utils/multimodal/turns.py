"""Multimodal context carry-over for multi-turn (agentic) rollouts.

A custom generate function that feeds environment observations back to the model appends them
to `sample.tokens` turn by turn. When an observation holds images (a screenshot, a cropped
view: `{"obs_str": "...<image>...", "multi_modal_data": {"image": [...]}}`), videos or, for an
Omni model, audio clips (`<audio>`), three things must grow together, or the engine and the
trainer see different inputs:

- the token ids: each placeholder of the observation expanded to the model's media tokens;
- the engine's `image_data` / `video_data` / `audio_data`: every item of the sample so far, in
  order (the next /generate sends the whole context; the prompt's own media first, through the
  run's media pipelines as the prompt's encoding saw them);
- the trainer's `sample.multimodal_train_inputs`: the new items' encoder tensors concatenated
  after the earlier ones (`pixel_values` / `image_grid_thw` rows, `input_features` /
  `feature_attention_mask` rows padded to the longest, `pixel_values_videos` / `video_grid_thw`
  rows), in the same order as their pad tokens in `sample.tokens`.

`MediaContext` keeps them in step:

    ctx = MediaContext(processor, sample)             # after the prompt was encoded
    out = await post(url, {"input_ids": sample.tokens, **ctx.request(), ...})
    ids = ctx.observe("<|im_start|>user\\n<image>what now?<|im_end|>\\n...", [image])
    sample.tokens += ids; sample.loss_mask += [0] * len(ids)

`GenerateState(args).media(sample)` builds one for the run's processor and media pipelines (None
for text runs). Observation items go through the same pipelines as the prompt's (images resized,
videos sampled and sized, audio resampled per the media flags).
"""

from __future__ import annotations

from typing import Any, Sequence

from relax.utils.multimodal.items import through_pipelines
from relax.utils.multimodal.tensors import collate


def merge_tensors(old: dict[str, Any] | None, new: dict[str, Any] | None) -> dict[str, Any] | None:
    """`old`'s encoder tensors followed by `new`'s, key by key (concatenated along dim 0, audio
    frames padded: `collate`)."""
    if not new:
        return old
    return collate([old, new])


class MediaContext:
    """The growing media of one multi-turn sample (see the module doc)."""

    def __init__(self, processor: Any, sample: Any, pipelines: dict[str, Any] | None = None) -> None:
        """`pipelines`: the run's media pipelines, which the prompt's media went through."""
        self.processor, self.sample, self.pipelines = processor, sample, pipelines
        media = {k: v for k, v in (sample.multimodal_inputs or {}).items() if k in processor.family.modalities}
        # field -> items (data URIs; videos' frame lists), in order
        self.data = processor.request_fields(self._prepared(media))

    def _prepared(self, media: dict[str, Any]) -> dict[str, list[Any]]:
        """Items through the run's pipelines (as the prompt's were), video files as frame lists."""
        media = through_pipelines(media, self.pipelines)
        if media.get("video"):
            media["video"] = [self.processor.as_frames(item) for item in media["video"]]
        return media

    def request(self) -> dict[str, list[Any]]:
        """The media fields of the next /generate request (every item so far)."""
        return {field: list(items) for field, items in self.data.items()}

    def observe(self, text: str, images: Sequence[Any] = (), audios: Sequence[Any] = (),
                videos: Sequence[Any] = ()) -> list[int]:
        """Token ids of an observation `text` whose `<image>` / `<audio>` / `<video>` placeholders
        stand for `images` / `audios` / `videos`; the items join the sample's media and its trainer
        tensors."""
        new = {k: list(v) for k, v in (("image", images), ("audio", audios), ("video", videos)) if v}
        encoded = self.processor.encode(text, self._prepared(new) or None)
        if new:
            inputs = dict(self.sample.multimodal_inputs or {})
            for modality, items in new.items():
                inputs[modality] = list(inputs.get(modality) or []) + items
            self.sample.multimodal_inputs = inputs
            self.sample.multimodal_train_inputs = merge_tensors(self.sample.multimodal_train_inputs, encoded.tensors)
            for field, uris in encoded.request.items():
                self.data[field] = self.data.get(field, []) + uris
        return encoded.input_ids
