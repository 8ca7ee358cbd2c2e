"""The backend registry (`relax.backends.registry`): the inference backends' engine options and
option checks, looked up by backend name and loaded lazily (the config and the components ask it
instead of naming a backend's module)."""

from __future__ import annotations

import dataclasses

import pytest

from relax.backends import registry
from relax.config import parse_config


def test_engine_options_come_from_the_backend_that_reads_them():
    from relax.backends.hf.launcher import ENGINE_OPTIONS

    assert registry.engine_options("hf") is ENGINE_OPTIONS
    assert registry.engine_options("sglang") is None  # every --sglang-* option reaches SGLang


def test_only_a_backend_with_an_option_check_judges_the_options(base):
    cfg = dataclasses.replace(parse_config(base), sglang={"api_key": "k"})
    registry.check_engine_options("hf", cfg)  # the hf engine keeps what it knows: nothing to check
    with pytest.raises(ValueError, match="--sglang-api-key: Relax sets --api-key per engine"):
        registry.check_engine_options("sglang", cfg)
