"""Reading prompt-data rows from `.jsonl` and `.parquet` files.

A `--prompt-data` value names one or more files: a path, a directory (every `.jsonl` /
`.parquet` file under it, sorted), a Python/JSON list of paths (verl style,
`"['a.parquet', 'b.parquet']"`), or a list object. Any path may carry a row slice,
`data.jsonl@[0:100]`, which keeps those rows (counted over non-empty rows, in file order).

Rows come back as `(location, row)` where the location is what an error message needs to
point a user at the row: the 1-based line number of a `.jsonl` file, the 0-based row index
of a `.parquet` file. A row that cannot be decoded is yielded as a `DataError` by
`iter_records` (so a caller that skips malformed rows can keep reading) and raised by
`read_rows`.
"""

from __future__ import annotations

import ast
import itertools
import json
import os
import re
from dataclasses import dataclass
from typing import Any, Iterator

SUPPORTED_EXTENSIONS: tuple[str, ...] = (".jsonl", ".parquet")

_SLICE_RE = re.compile(r"^(?P<path>.*)@\[(?P<start>-?\d*):(?P<stop>-?\d*)\]$")


class DataError(ValueError):
    """A prompt-data row that cannot be turned into a prompt; names the file and row."""


@dataclass(frozen=True)
class RowLocation:
    """Where a row lives: `file` and either a 1-based jsonl line or a 0-based parquet row index."""

    file: str
    index: int
    is_line: bool

    def __str__(self) -> str:
        where = f"line {self.index}" if self.is_line else f"row index {self.index}"
        return f"{self.file} ({where})"


def resolve_prompt_paths(prompt_data: Any, *, flag: str = "--prompt-data") -> list[str]:
    """Turn a `--prompt-data` value into a list of file paths (each may keep an `@[a:b]` slice).

    Accepts a path, a directory, a list/tuple of paths, or a string holding a JSON or
    Python list (`"['a.parquet', 'b.parquet']"`; unquoted `[a.parquet, b.parquet]` too).
    """
    if prompt_data is None:
        raise ValueError(f"{flag} is not set; pass a .jsonl/.parquet file, a directory or a list of files")
    items = _as_path_list(prompt_data, flag=flag)
    paths: list[str] = []
    for item in items:
        base, _ = _split_slice(item)
        paths.extend(_expand_directory(base) if os.path.isdir(base) else [item])
    if not paths:
        raise ValueError(f"{flag} {prompt_data!r} names no .jsonl/.parquet files")
    return paths


def _as_path_list(value: Any, *, flag: str) -> list[str]:
    if isinstance(value, (list, tuple)):
        return [str(v) for v in value]
    if not isinstance(value, (str, os.PathLike)):
        raise ValueError(f"{flag}: expected a path or a list of paths, got {type(value).__name__} {value!r}")
    text = str(value).strip()
    if not (text.startswith("[") and text.endswith("]")):
        return [text]
    for parse in (json.loads, ast.literal_eval):
        try:
            parsed = parse(text)
        except (ValueError, SyntaxError):
            continue
        if isinstance(parsed, (list, tuple)) and all(isinstance(p, str) for p in parsed):
            return [p.strip() for p in parsed]
    # Unquoted list: [a.parquet, b.parquet]
    return [p.strip().strip("'\"") for p in text[1:-1].split(",") if p.strip()]


def _expand_directory(directory: str) -> list[str]:
    found = []
    for root, _, names in os.walk(directory):
        found.extend(os.path.join(root, n) for n in names if n.endswith(SUPPORTED_EXTENSIONS))
    return sorted(found)


def _split_slice(path: str) -> tuple[str, slice | None]:
    match = _SLICE_RE.match(path)
    if match is None:
        return path, None
    start, stop = match.group("start"), match.group("stop")
    return match.group("path"), slice(int(start) if start else None, int(stop) if stop else None)


def check_data_file(path: str, *, flag: str = "--prompt-data") -> None:
    """Fail early, naming `flag`, unless `path` (an `@[a:b]` slice allowed) is an existing data file."""
    path, _ = _split_slice(str(path))
    if not path.endswith(SUPPORTED_EXTENSIONS):
        raise ValueError(
            f"{flag}: unsupported file {path!r}; supported extensions are {', '.join(SUPPORTED_EXTENSIONS)}"
        )
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{flag}: prompt data file {path!r} does not exist; check the path passed to {flag}")


def iter_records(path: str, *, flag: str = "--prompt-data") -> Iterator[tuple[RowLocation, dict | DataError]]:
    """Yield `(location, row_or_error)` for every non-empty row of one file (slice applied)."""
    for location, payload in iter_raw_records(path, flag=flag):
        yield location, decode_record(location, payload)


def iter_raw_records(path: str, *, flag: str = "--prompt-data") -> Iterator[tuple[RowLocation, str | dict]]:
    """Like `iter_records` but jsonl lines stay undecoded strings (cheap to skip over when resuming)."""
    real_path, row_slice = _split_slice(str(path))
    check_data_file(real_path, flag=flag)
    records = iter_jsonl_lines(real_path) if real_path.endswith(".jsonl") else _iter_parquet(real_path)
    return records if row_slice is None else _apply_slice(records, row_slice)


def decode_record(location: RowLocation, payload: str | dict) -> dict | DataError:
    """A raw record from `iter_raw_records` as a row dict, or a `DataError` saying what is wrong."""
    return parse_jsonl_line(location, payload) if isinstance(payload, str) else payload


def _apply_slice(records: Iterator, row_slice: slice) -> Iterator:
    if (row_slice.start or 0) >= 0 and (row_slice.stop is None or row_slice.stop >= 0):
        return itertools.islice(records, row_slice.start, row_slice.stop)
    return iter(list(records)[row_slice])  # negative bounds need the row count


def iter_jsonl_lines(path: str) -> Iterator[tuple[RowLocation, str]]:
    """Yield `(location, raw_line)` for every non-blank line; parsing is left to `parse_jsonl_line`."""
    with open(path, encoding="utf-8") as handle:
        for line_no, line in enumerate(handle, start=1):
            if line.strip():
                yield RowLocation(path, line_no, is_line=True), line


def parse_jsonl_line(location: RowLocation, line: str) -> dict | DataError:
    """Decode one jsonl line into a row dict, or a `DataError` that says what is wrong."""
    try:
        row = json.loads(line.rstrip("\r\n"))  # (with the newline, an error at the end reads "line 2 column 1")
    except json.JSONDecodeError as exc:
        return DataError(f"{location}: invalid JSON ({exc.msg} at column {exc.colno}); fix or remove this line")
    if not isinstance(row, dict):
        return DataError(
            f"{location}: expected a JSON object per line, got {type(row).__name__}; "
            'write each row as {"<input-key>": ..., "<label-key>": ...}'
        )
    return row


def _iter_parquet(path: str) -> Iterator[tuple[RowLocation, dict]]:
    import pyarrow.parquet as pq

    parquet = pq.ParquetFile(path)
    index = 0
    # Row group by row group: iter_batches() fails on nested types across row groups.
    for group in range(parquet.metadata.num_row_groups):
        for row in parquet.read_row_group(group).to_pylist():
            yield RowLocation(path, index, is_line=False), row
            index += 1


def read_rows(path: str, *, flag: str = "--prompt-data") -> Iterator[tuple[int, dict]]:
    """Yield `(line_no_or_row_index, row)` for one `.jsonl`/`.parquet` file; raise `DataError` on a bad row."""
    for location, row in iter_records(path, flag=flag):
        if isinstance(row, DataError):
            raise row
        yield location.index, row


def count_rows(path: str, *, flag: str = "--prompt-data") -> int:
    """Number of rows in one file (slice applied) without decoding them."""
    real_path, row_slice = _split_slice(str(path))
    check_data_file(real_path, flag=flag)
    if real_path.endswith(".jsonl"):
        total = sum(1 for _ in iter_jsonl_lines(real_path))
    else:
        import pyarrow.parquet as pq

        total = pq.ParquetFile(real_path).metadata.num_rows
    return total if row_slice is None else len(range(total)[row_slice])
