"""Suite-wide fixtures."""

from __future__ import annotations

import logging

import pytest


@pytest.fixture(autouse=True)
def _relax_logging_propagates():
    """Components call `setup_logging()`, which stops the `relax` logger propagating (its own
    handler prints once); undo that after each test so later tests' `caplog` sees records."""
    yield
    root = logging.getLogger("relax")
    for handler in [h for h in root.handlers if getattr(h, "_relax", False)]:
        root.removeHandler(handler)
    root.propagate = True
