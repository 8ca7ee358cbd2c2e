"""Where a run's scaling API is found (`relax.engine.elastic.discovery`): a poller that reads the files
while the run writes them finds them whole or not at all (CI once read an empty `scale_api.json`,
created but not yet written, and failed with a JSONDecodeError); both files are private."""

from __future__ import annotations

import os
import stat

import pytest

from relax.engine.elastic import discovery
from relax.utils import logging as relax_logging


def test_a_poller_never_reads_the_files_half_written(tmp_path, monkeypatch):
    seen = []
    real_fdopen = os.fdopen

    class Probe:
        """The file object of the write: on each write, what a poller would read now."""

        def __init__(self, f):
            self.f = f

        def __enter__(self):
            self.f.__enter__()
            return self

        def __exit__(self, *exc):
            return self.f.__exit__(*exc)

        def write(self, text):
            try:
                seen.append(discovery.find(str(tmp_path)))
            except FileNotFoundError:
                seen.append(None)
            return self.f.write(text)

    monkeypatch.setattr(relax_logging.os, "fdopen", lambda fd, mode: Probe(real_fdopen(fd, mode)))
    token = discovery.new_token(str(tmp_path))
    discovery.publish(str(tmp_path), "http://127.0.0.1:1")
    discovery.publish(str(tmp_path), "http://127.0.0.1:2")  # a second publish: the first stays readable
    assert seen == [None, None, ("http://127.0.0.1:1", token)]
    assert discovery.find(str(tmp_path)) == ("http://127.0.0.1:2", token)
    directory = tmp_path / ".relax"
    assert sorted(p.name for p in directory.iterdir()) == [discovery.API_FILE, discovery.TOKEN_FILE]
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    for path in directory.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_find_names_what_to_check_and_unpublish_removes_both(tmp_path):
    discovery.new_token(str(tmp_path))
    discovery.publish(str(tmp_path), "http://127.0.0.1:1")
    discovery.unpublish(str(tmp_path))
    with pytest.raises(FileNotFoundError, match="--scale-api"):
        discovery.find(str(tmp_path))
