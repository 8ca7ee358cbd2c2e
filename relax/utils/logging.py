"""Process-wide logging setup and the run's shared secret.

Every process of a run (driver, Serve replicas, train workers, engines) calls
`setup_logging()` so `logging.getLogger(__name__)` output looks the same everywhere.
`run_token()` is the per-run token that state-changing engine endpoints require. The driver
generates it and writes it to a file only its user can read (`write_token_file`, mode 0600 in a
0700 directory of the run directory, removed when the run ends); roles learn the file's path,
never the token, from the runtime environment, because Ray logs runtime environments to
world-readable files. Engines started by a role get the token in their own environment.
"""

from __future__ import annotations

import logging
import os
import secrets

TOKEN_FILE_ENV = "RELAX_RUN_TOKEN_FILE"
_FORMAT = "%(asctime)s %(levelname).1s %(name)s: %(message)s"


def setup_logging(level: str | None = None) -> None:
    level = (level or os.environ.get("RELAX_LOG_LEVEL", "INFO")).upper()
    root = logging.getLogger("relax")
    if not any(getattr(h, "_relax", False) for h in root.handlers):
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter(_FORMAT, datefmt="%H:%M:%S"))
        handler._relax = True  # type: ignore[attr-defined]
        root.addHandler(handler)
        root.propagate = False
    root.setLevel(level)


def new_run_token() -> str:
    return secrets.token_urlsafe(24)


def write_private_file(path: str, text: str) -> None:
    """Write `text` to `path`, readable by this user only (the directory too). Atomic: the text goes to
    a private temporary file that is renamed over `path`, so a reader polling for `path` finds it
    whole or not at all (an empty file, half written, made a poller's json.loads fail)."""
    directory = os.path.dirname(path)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    os.chmod(directory, 0o700)
    partial = f"{path}.{os.getpid()}.partial"
    if os.path.exists(partial):
        os.unlink(partial)
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(partial, path)


def write_token_file(path: str, token: str) -> None:
    """Write `token` to `path`, readable by this user only (the directory too)."""
    write_private_file(path, token)


def remove_token_file(path: str) -> None:
    try:
        os.unlink(path)
        os.rmdir(os.path.dirname(path))
    except OSError:
        pass


_token_cache: dict[str, str] = {}


def run_token() -> str | None:
    """The run's token, read from `$RELAX_RUN_TOKEN_FILE` (None outside a run)."""
    path = os.environ.get(TOKEN_FILE_ENV)
    if not path:
        return None
    if path not in _token_cache:
        try:
            with open(path) as f:
                _token_cache[path] = f.read().strip()
        except OSError as err:
            raise RuntimeError(f"cannot read the run token file {path} ({err.strerror}): a role on another "
                               "node needs the run directory (--exp-dir) on a filesystem every node mounts") from err
    return _token_cache[path]
