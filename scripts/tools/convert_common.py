"""What the dataset converters share (`process_verl.py`, `process_openr1.py`, `process_avqa.py`).

Each converter is a standalone script; this module sits next to them and each puts its own
directory on `sys.path` to import it. Here: the error for a row that cannot be converted,
reading parquet row group by row group, finding a dataset's parquet files, a short repr for
error messages, and the summary a converter prints (`rows in=... skipped=...`, the first
reasons).
"""

from __future__ import annotations

import os
from typing import Any, Iterator

MAX_REASONS_SHOWN = 5


class BadRowError(ValueError):
    """A row that cannot be converted; the message names the field and the problem."""


def describe(value: Any, limit: int = 60) -> str:
    """A short repr of a bad value, for error messages."""
    text = repr(value)
    return f"{type(value).__name__} {text[:limit]}{'...' if len(text) > limit else ''}"


def find_parquet_files(input_path: str, *, what: str, missing_hint: str) -> list[str]:
    """A `.parquet` file, or every `.parquet` file under a directory (sorted). `what`: what the
    dataset is ("verl data"); `missing_hint`: what to pass when the path does not exist."""
    if os.path.isfile(input_path):
        if not input_path.endswith(".parquet"):
            raise ValueError(f"--input-dir {input_path!r} is not a .parquet file; {what} is parquet")
        return [input_path]
    if not os.path.isdir(input_path):
        raise FileNotFoundError(f"--input-dir {input_path!r} does not exist; {missing_hint}")
    files = sorted(os.path.join(root, name) for root, _, names in os.walk(input_path)
                   for name in names if name.endswith(".parquet"))
    if not files:
        raise ValueError(f"--input-dir {input_path!r} holds no .parquet files")
    return files


def iter_parquet_rows(path: str) -> Iterator[dict]:
    """Rows as plain Python dicts, one row group at a time (nested columns stay dicts / lists)."""
    import pyarrow.parquet as pq

    parquet = pq.ParquetFile(path)
    for group in range(parquet.metadata.num_row_groups):
        yield from parquet.read_row_group(group).to_pylist()


def print_summary(tool: str, summary: dict, *, converted: str, target: str) -> None:
    """`<tool>: rows in=N <converted>=M skipped=K -> <target>`, then the first skip reasons."""
    print(f"{tool}: rows in={summary['rows_in']} {converted}={summary['rows_out']} skipped={summary['skipped']} "
          f"-> {target}")
    for reason in summary["reasons"][:MAX_REASONS_SHOWN]:
        print(f"  skipped {reason}")
    if summary["skipped"] > MAX_REASONS_SHOWN:
        print(f"  ... and {summary['skipped'] - MAX_REASONS_SHOWN} more")
