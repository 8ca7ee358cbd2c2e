"""What a running run exposes, read from the outside while it trains (the shared interrupted
run, stopped after it): every listening socket of every process it started is on loopback, and
its token is in no log, no Ray session file, no world-readable file: only in the run's 0600
token file, which is gone once the run ends."""

from __future__ import annotations

import pytest
from subprocess_runs import files_containing, is_loopback

pytestmark = pytest.mark.integration


def test_every_listening_socket_of_a_local_run_is_on_loopback(interrupted_run):
    sockets = interrupted_run.sockets
    names = {name for _, name, _, _ in sockets}
    # Ray's own servers, TransferQueue's, the train group's store and the engine are all there.
    assert {"gcs_server", "raylet"} <= names and len(sockets) > 10, sockets
    exposed = [s for s in sockets if not is_loopback(s[2])]
    assert exposed == [], f"listening beyond loopback (pid, process, address, port): {exposed}"


def test_the_run_token_reaches_no_log_and_no_world_readable_file(interrupted_run):
    run = interrupted_run
    assert run.token and len(run.token) >= 24, "the run's token file was not found under <exp_dir>/.relax"
    assert run.session_dirs, "the run's Ray session directory was not found"
    # During the run: only the token file holds it, readable by this user alone (dir too).
    assert run.token_files_during == [run.token_file]
    assert run.token_modes == (0o600, 0o700)
    # After it: the token file is gone and nothing else picked the token up meanwhile.
    assert not run.token_file.exists()
    left = [p for root in [run.exp_dir, *run.session_dirs] for p in files_containing(root, run.token)]
    assert left == []
