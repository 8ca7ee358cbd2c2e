"""`--use-audio-in-video`: a video's audio track heard with its frames (the Qwen3-Omni thinker).

A video that carries its audio (`{"frames": [...], "fps": f, "audio": <audio item>}`, or a video
file whose audio track PyAV decodes) becomes one block in which the video's pad tokens and its
audio's pad tokens are interleaved by time, as Qwen3-Omni's processor lays them out:

    <|vision_start|><|audio_start|> v v v v a a a v v v v a a ... <|audio_end|><|vision_end|>

Each video token stands at `t x seconds_per_grid x position_id_per_seconds` (its temporal slice
t), each audio token at its index; going through both in order, the video token comes first when
its time is not later (`interleave`). The model's `get_rope_index` (called with
`use_audio_in_video=True` for such a row) walks the same rule, so the positions line up with the
tokens; the values are computed in float32 as it computes them.

The audio features of a prompt go to the model in the order of their pad tokens: a video's audio
at its `<video>` placeholder, standalone clips at their `<audio>` ones (`audio_order`).
"""

from __future__ import annotations

import re
from typing import Any, Sequence

from relax.utils.multimodal.sources import MediaError


def video_audio(item: Any, k: int) -> Any:
    """The audio track a video item carries; MediaError when it has none."""
    audio = item.get("audio") if isinstance(item, dict) else None
    if audio is None and isinstance(item, dict) and item.get("audio_source") is not None:
        from relax.utils.multimodal.video import read_audio_track

        audio = read_audio_track(item["audio_source"])  # a video file's own track
    if audio is None:
        raise MediaError(f"--use-audio-in-video: video {k} has no audio track; give frame-list videos one "
                         "({'frames': [...], 'fps': f, 'audio': <wav path, bytes or {'array', 'sampling_rate'}>}) "
                         "or drop the flag")
    return audio


def audio_order(text: str, audios: Sequence[Any], videos: Sequence[Any]) -> tuple[list[Any], list[int], list[int]]:
    """(every audio in the order of its pad tokens, the index in it of each standalone audio, the
    index in it of each video's audio), from the order of the `<audio>` / `<video>` placeholders."""
    ordered: list[Any] = []
    standalone: list[int] = []
    in_video: list[int] = []
    for match in re.finditer("<audio>|<video>", text):
        if match.group(0) == "<audio>":
            standalone.append(len(ordered))
            ordered.append(audios[len(standalone) - 1])
        else:
            in_video.append(len(ordered))
            ordered.append(video_audio(videos[len(in_video) - 1], len(in_video) - 1))
    return ordered, standalone, in_video


def interleave(grid_thw: Sequence[int], seconds_per_grid: float, position_id_per_seconds: float, merge: int,
               audio_tokens: int) -> list[str]:
    """The token kinds ("v" video, "a" audio) of one video with its audio, in sequence order."""
    import torch

    t, h, w = grid_thw
    per_slice = (h // merge) * (w // merge)
    video_at = (torch.arange(t) * torch.tensor(seconds_per_grid, dtype=torch.float32)
                * position_id_per_seconds).float().repeat_interleave(per_slice).tolist()
    audio_at = torch.arange(audio_tokens).float().tolist()
    out, v, a = [], 0, 0
    while v < len(video_at) and a < len(audio_at):
        if video_at[v] <= audio_at[a]:
            out.append("v")
            v += 1
        else:
            out.append("a")
            a += 1
    return out + ["v"] * (len(video_at) - v) + ["a"] * (len(audio_at) - a)
