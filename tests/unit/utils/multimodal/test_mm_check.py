"""Cheap media checks of the in-memory dataset: missing or corrupt local items, URLs not fetched."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from relax.utils.multimodal import MediaError
from relax.utils.multimodal.check import check_item, check_row_media


def png() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (4, 4)).save(buf, format="PNG")
    return buf.getvalue()


def test_good_items_pass_and_urls_are_not_fetched():
    check_item("image", png())
    check_item("image", "https://example.invalid/a.png")
    check_item("video", {"frames": [png(), png()], "fps": 2})


@pytest.mark.parametrize("kind, item, needle", [
    ("image", png()[:20], "not a decodable image"), ("audio", b"RIFFxxxxWAVEjunk", "not a readable WAV"),
    ("audio", b"ID3 not really an mp3", "not a decodable audio file"),
    ("video", [png(), b"junk"], "not a decodable image"), ("image", "/no/such.png", "cannot read"),
])
def test_corrupt_or_missing_items_are_media_errors(kind, item, needle):
    with pytest.raises(MediaError, match=needle):
        check_item(kind, item)


def test_row_errors_name_the_column():
    with pytest.raises(MediaError, match="column 'pics'.*'/no/such.png'"):
        check_row_media({"pics": [png(), "/no/such.png"]}, {"image": "pics"})
