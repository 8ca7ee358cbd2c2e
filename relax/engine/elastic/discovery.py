"""Where a run's scaling API is found: `<exp-dir>/.relax/scale_api.json` (its base URL) and
`<exp-dir>/.relax/scale_token` (the bearer token), both readable by the run's user only (0600 in a 0700
directory), written when the API starts and removed when the run ends. The token is generated per run,
never logged and never put in argv, a URL or the Ray runtime environment (Ray logs those)."""

from __future__ import annotations

import json
import os

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
    write_private_file(_paths(exp_dir)[0], json.dumps({"api": url, "pid": os.getpid()}))


def unpublish(exp_dir: str) -> None:
    for path in _paths(exp_dir):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def find(exp_dir: str) -> tuple[str, str]:
    """(base URL, token) of the run in `exp_dir`; FileNotFoundError saying what to check."""
    api_path, token_path = _paths(exp_dir)
    if not os.path.exists(api_path) or not os.path.exists(token_path):
        raise FileNotFoundError(f"no scaling API recorded in {exp_dir}/.relax ({API_FILE}, {TOKEN_FILE}): is a run "
                                "with this --exp-dir running, with --scale-api on (the default)?")
    with open(api_path) as f:
        url = json.load(f)["api"]
    with open(token_path) as f:
        return url, f.read().strip()
