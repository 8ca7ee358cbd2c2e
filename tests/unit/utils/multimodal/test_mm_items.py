"""A media item's forms between the data row, the processor and the engine: a sampled video keeps
where its audio track is (for --use-audio-in-video)."""

from __future__ import annotations

from relax.utils.multimodal.items import keep_audio


def test_a_sampled_video_remembers_its_file_and_reads_the_track_only_when_asked():
    """A video file item keeps its source (decoded only when the flag asks), a frame-list item its
    `"audio"`; a bare frame list has no track."""
    path = "/videos/camera.mkv"
    assert keep_audio({}, path) == {"audio_source": path}
    assert keep_audio({}, {"frames": [1], "audio": b"wav"}) == {"audio": b"wav"} and keep_audio({}, [1]) == {}
