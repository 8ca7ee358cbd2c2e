"""Prompt data: file readers, row formatting, in-memory and streaming prompt datasets."""

from relax.utils.data.dataset import PromptDataset, StreamingPromptDataset
from relax.utils.data.formatting import PromptFormat, build_sample
from relax.utils.data.readers import DataError, read_rows, resolve_prompt_paths
from relax.utils.data.sampler import EpochSampler

__all__ = [
    "DataError",
    "EpochSampler",
    "PromptDataset",
    "PromptFormat",
    "StreamingPromptDataset",
    "build_sample",
    "read_rows",
    "resolve_prompt_paths",
]
