"""Where a run's scaling API is found: `<exp-dir>/.relax/scale_api.json` (its base URL) and
`<exp-dir>/.relax/scale_token` (the bearer token), both readable by the run's user only (0600 in a 0700
directory), written when the API starts and removed when the run ends. The token is generated per run,
never logged and never put in argv, a URL or the Ray runtime environment (Ray logs those)."""

from __future__ import annotations

import json
import os
import socket

from relax.utils.logging import new_run_token, write_private_file, write_token_file

API_FILE, TOKEN_FILE = "scale_api.json", "scale_token"


def _paths(exp_dir: str) -> tuple[str, str]:
    directory = os.path.join(exp_dir, ".relax")
    return os.path.join(directory, API_FILE), os.path.join(directory, TOKEN_FILE)


def new_token(exp_dir: str) -> str:
    """A fresh token, written to the run's token file (0600)."""
    token = new_run_token()
    write_token_file(_paths(exp_dir)[1], token)
    return token


def publish(exp_dir: str, url: str) -> None:
    """Record where the API listens (after `new_token`); the file appears whole (a poller never reads it
    half written)."""
    write_private_file(_paths(exp_dir)[0], json.dumps({"api": url, "pid": os.getpid(), "host": socket.gethostname()}))


def unpublish(exp_dir: str) -> None:
    for path in _paths(exp_dir):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def find(exp_dir: str) -> tuple[str, str]:
    """(base URL, token) of the run in `exp_dir`; FileNotFoundError saying what to check, ValueError
    naming a file that is not what a run writes."""
    url = _recorded(exp_dir)[0]
    with open(_paths(exp_dir)[1]) as f:
        return url, f.read().strip()


def unreachable(exp_dir: str, url: str) -> str:
    """Why nothing answers at the recorded `url`, for an error message: whether the process that
    recorded it still runs (when it ran on this machine: the API binds loopback by default), and the fix."""
    api_path, _ = _paths(exp_dir)
    try:
        _, pid, host = _recorded(exp_dir)
    except (FileNotFoundError, ValueError):
        return f"nothing answers at {url}, and {api_path} is gone: the run has ended"
    if pid is not None and host == socket.gethostname() and not _running(pid):
        return (f"nothing answers at {url}, recorded in {api_path} by process {pid}, which is not running: the run "
                "ended without removing the file (killed?). Start a run with this --exp-dir, or delete the file")
    return (f"nothing answers at {url} (recorded in {api_path}): is the run still starting or stopping, or on "
            "another node? Run relax-scale on the Rollout replica's node, or set --scale-api-host")


def _recorded(exp_dir: str) -> tuple[str, int | None, str | None]:
    """(URL, pid, host) of the record."""
    api_path, token_path = _paths(exp_dir)
    if not os.path.exists(api_path) or not os.path.exists(token_path):
        raise FileNotFoundError(f"no scaling API recorded in {exp_dir}/.relax ({API_FILE}, {TOKEN_FILE}): is a run "
                                "with this --exp-dir running, with --scale-api on (the default)?")
    try:
        with open(api_path) as f:
            record = json.load(f)
        return str(record["api"]), record.get("pid"), record.get("host")
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{api_path} is not the record a run writes ({{\"api\": URL, \"pid\": N, \"host\": NAME}}): "
                         f"{type(exc).__name__}: {exc}. Delete it if no run uses this --exp-dir") from exc


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True
