"""Fixtures for prompt-data tests (helpers live in prompt_data_helpers.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from prompt_data_helpers import build_tiny_tokenizer


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tiny_tokenizer")
    build_tiny_tokenizer(path)
    return path


@pytest.fixture(scope="session")
def tokenizer(tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tokenizer_dir))
