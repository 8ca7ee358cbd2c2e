"""Where a run's scaling API is found (`relax.engine.elastic.discovery`): a poller that reads the files
while the run writes them finds them whole or not at all (CI once read an empty `scale_api.json`,
created but not yet written, and failed with a JSONDecodeError); both files are private; `relax-scale`
names a record left behind by a run that is gone, and one that is not a run's record."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess

import pytest

from relax.engine.elastic import discovery
from relax.entrypoints import scale
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


def _stale_record(tmp_path, pid: int, host: str) -> str:
    """A record left by a run that ended without removing it, pointing at a port nothing listens on."""
    from relax.utils.net import free_port

    discovery.new_token(str(tmp_path))
    url = f"http://127.0.0.1:{free_port()}"
    (tmp_path / ".relax" / discovery.API_FILE).write_text(json.dumps({"api": url, "pid": pid, "host": host}))
    return url


def test_relax_scale_names_a_record_left_by_a_run_that_is_gone(tmp_path, capsys):
    gone = subprocess.Popen(["true"])
    gone.wait()
    url = _stale_record(tmp_path, gone.pid, socket.gethostname())
    assert scale.main(["--exp-dir", str(tmp_path), "--timeout", "5", "status"]) == 1
    err = capsys.readouterr().err
    assert f"nothing answers at {url}" in err and f"process {gone.pid}, which is not running" in err, err
    assert "delete the file" in err


def test_relax_scale_does_not_judge_a_process_of_another_node(tmp_path, capsys):
    _stale_record(tmp_path, os.getpid() + 10**6, "another-node")
    assert scale.main(["--exp-dir", str(tmp_path), "--timeout", "5", "status"]) == 1
    err = capsys.readouterr().err
    assert "not running" not in err and "on another node" in err and "--scale-api-host" in err, err


@pytest.mark.parametrize("text", ["", "{", '{"pid": 1}', "[1, 2]"])
def test_a_record_that_is_not_a_runs_is_named_not_a_traceback(tmp_path, capsys, text):
    discovery.new_token(str(tmp_path))
    (tmp_path / ".relax" / discovery.API_FILE).write_text(text)
    assert scale.main(["--exp-dir", str(tmp_path), "status"]) == 1
    err = capsys.readouterr().err
    assert f"{discovery.API_FILE} is not the record a run writes" in err and "Delete it" in err, err


def test_a_record_removed_meanwhile_means_the_run_has_ended(tmp_path):
    url = _stale_record(tmp_path, os.getpid(), socket.gethostname())
    discovery.unpublish(str(tmp_path))  # the run ended between relax-scale's read and its request
    assert discovery.unreachable(str(tmp_path), url).endswith("is gone: the run has ended")
