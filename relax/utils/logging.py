"""Process-wide logging setup and the run's shared secret.

Every process of a run (driver, Serve replicas, train workers, engines) calls
`setup_logging()` so `logging.getLogger(__name__)` output looks the same everywhere.
`run_token()` is the per-run token that state-changing engine endpoints require; the driver
generates it and hands it to every role through the runtime environment.
"""

from __future__ import annotations

import logging
import os
import secrets

TOKEN_ENV = "RELAX_RUN_TOKEN"
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


def run_token() -> str | None:
    return os.environ.get(TOKEN_ENV)
