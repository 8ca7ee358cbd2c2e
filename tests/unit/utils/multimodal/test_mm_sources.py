"""Media sources: local paths, file://, data: URIs, raw bytes, HF structs, and http(s) URLs."""

from __future__ import annotations

import base64
import http.server
import socket
import threading

import pytest

from relax.config.schema import DataConfig
from relax.utils.multimodal import PIPELINES, MediaError, build_pipelines, read_bytes


def test_local_forms_all_give_the_bytes(tmp_path):
    path = tmp_path / "a.bin"
    path.write_bytes(b"abc")
    for item in (str(path), f"file://{path}", b"abc", bytearray(b"abc"), {"bytes": b"abc", "path": "ignored"},
                 {"path": str(path)}, "data:image/png;base64," + base64.b64encode(b"abc").decode()):
        assert read_bytes(item) == b"abc"


@pytest.mark.parametrize("item, needle", [
    ("data:image/png,abc", "only base64"), ("data:image/png;base64,@@@", "invalid base64"),
    ("ftp://x.org/a.png", "unsupported URL scheme"), ({"path": None}, "neither set"), (3, "expected a path"),
])
def test_bad_items_are_media_errors_naming_the_problem(item, needle):
    with pytest.raises(MediaError, match=needle):
        read_bytes(item, "image")


@pytest.fixture
def http_server(tmp_path):
    (tmp_path / "a.png").write_bytes(b"served")
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args):
            super().__init__(*args, directory=str(tmp_path))

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_reachable_url_is_fetched(http_server):
    assert read_bytes(f"{http_server}/a.png") == b"served"


def test_unreachable_or_missing_url_is_a_clear_error(http_server):
    with pytest.raises(MediaError, match="cannot fetch.*HTTP 404"):
        read_bytes(f"{http_server}/missing.png", "image")
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(MediaError, match=rf"image 'http://127.0.0.1:{port}/a.png': cannot fetch"):
        read_bytes(f"http://127.0.0.1:{port}/a.png", "image", timeout=2)


def test_registry_builds_one_pipeline_per_modality_from_the_flags():
    flags = DataConfig(image_max_token_num=64, audio_sample_rate=8000)
    pipelines = build_pipelines(flags, ["image", "audio"])
    assert set(PIPELINES) == {"image", "video", "audio"} and set(pipelines) == {"image", "audio"}
    assert pipelines["image"].cfg.max_tokens == 64 and pipelines["audio"].cfg.sample_rate == 8000
    with pytest.raises(ValueError, match="--multimodal-keys: unknown type"):
        build_pipelines(flags, ["smell"])
