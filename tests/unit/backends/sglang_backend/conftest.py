"""The sglang backend's tests: most need no SGLang; those that run SGLang's own argument parser
take the `sglang_parser` fixture, which skips (saying why) where that parser does not import."""

from __future__ import annotations

import pytest

from relax.backends.sglang.args import SGLangMissing, sglang_available, validate_server_argv

INSTALL = "pip install --no-deps sglang==0.5.23 && pip install triton pybase64 orjson ipython"


@pytest.fixture(scope="session")
def sglang_parser():
    """`validate_server_argv`, or a skip: sglang is not installed, or its parser does not import."""
    if not sglang_available():
        pytest.skip(f"sglang is not installed; SGLang's argument parser runs on CPU after: {INSTALL}")
    try:
        validate_server_argv(["--model-path", "m"])
    except SGLangMissing as exc:
        pytest.skip(f"{exc} (the parser needs: {INSTALL})")
    return validate_server_argv
