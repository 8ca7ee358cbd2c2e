"""Convert verl-format parquet prompt data into Relax prompt rows.

Usage:
    python3 scripts/tools/process_verl.py --input-dir verl/train.parquet --output-dir relax/train.parquet
    python3 scripts/tools/process_verl.py --input-dir verl_data/ --output-dir relax/train.jsonl --md-dir verl_data/
    python3 scripts/tools/process_verl.py --input-dir verl_data/ --output-dir relax_data/   # one .parquet per input

verl keeps the ground truth inside a nested `reward_model` dict and routes rewards by a top-level
`data_source` column; Relax reads a flat label column into `sample.label` and one metadata dict into
`sample.metadata`. Per row (`convert_row`):

| verl column                          | Relax column                                                   |
|--------------------------------------|----------------------------------------------------------------|
| `prompt` (chat messages or a string) | `prompt`, unchanged (use `--input-key prompt`)                  |
| `reward_model["ground_truth"]`       | `label`, a plain string (numbers are written with `str`)       |
| `extra_info` (dict)                  | `extra_info`, a dict (use `--metadata-key extra_info`)          |
| `data_source`, `ability`, any other  | keys of `extra_info` under the column's name (the column wins  |
| top-level column                     | over an `extra_info` key of the same name)                     |
| `preprocessed_images`, else `images` | `image`: a list of raw bytes or paths                         |

Train with `--input-key prompt --label-key label --metadata-key extra_info` (and
`--multimodal-keys '{"image": "image"}'` for images). `data_source` goes into `extra_info` because
Relax has one metadata column per row; a reward function reads it as `sample.metadata["data_source"]`.

Image items may be raw bytes, `{"bytes": ..., "path": ...}` dicts (the Hugging Face `Image`
layout) or path strings; bytes win over a path. `--md-dir DIR` joins relative paths onto DIR.
In `.parquet` output bytes stay raw bytes; `.jsonl` cannot hold bytes, so they are written as
`data:<mime>;base64,...` URLs.

A row without a ground truth, or with a value of the wrong type, stops the conversion with an
error naming the file, the 0-based row index and the problem; `--skip-bad-rows` skips and counts
such rows instead. The output format follows the output extension (`.parquet` / `.jsonl`); an
output path without one of these extensions is a directory that gets one `.parquet` per input file.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
from dataclasses import dataclass, field
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # convert_common.py, next to this script
from convert_common import BadRowError, describe, find_parquet_files, iter_parquet_rows, print_summary  # noqa: E402

OUTPUT_EXTENSIONS = (".parquet", ".jsonl")
IMAGE_COLUMNS = ("preprocessed_images", "images")  # first non-empty one wins
CONSUMED_COLUMNS = ("prompt", "reward_model", "extra_info", *IMAGE_COLUMNS)


@dataclass
class ConversionResult:
    """Rows converted from one or more files, and the rows skipped (with reasons)."""

    rows: list[dict] = field(default_factory=list)
    num_in: int = 0
    skipped: list[str] = field(default_factory=list)


# ---------------------------------------------------------------- one row


def convert_row(row: dict, *, md_dir: str | None = None) -> dict:
    """One verl row -> one Relax row {"prompt", "label", "extra_info"[, "image"]}; `BadRowError` if bad."""
    if not isinstance(row, dict):
        raise BadRowError(f"expected a row dict, got {type(row).__name__}")
    out = {"prompt": convert_prompt(row.get("prompt")), "label": extract_label(row.get("reward_model")),
           "extra_info": build_extra_info(row)}
    images = extract_images(row, md_dir=md_dir)
    if images is not None:
        out["image"] = images
    return out


def convert_prompt(prompt: Any) -> str | list[dict]:
    """The prompt as-is: a string, or a list of {"role", "content", ...} messages (null fields dropped)."""
    prompt = _to_python(prompt)
    if isinstance(prompt, str) and prompt:
        return prompt
    if not isinstance(prompt, list) or not prompt:
        raise BadRowError(f"'prompt' must be a non-empty string or a non-empty list of chat messages, "
                          f"got {describe(prompt)}")
    messages = []
    for i, message in enumerate(prompt):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str) or message.get("content") is None:
            raise BadRowError(f"'prompt' message {i} must be a dict with a string 'role' and a 'content', "
                              f"got {describe(message)}")
        # Parquet stores messages as structs: keys used by any row appear as nulls in the others.
        messages.append({k: v for k, v in message.items() if v is not None})
    return messages


def extract_label(reward_model: Any) -> str:
    """`reward_model["ground_truth"]` as a plain string (Relax's `--label-key` column)."""
    reward_model = _to_python(reward_model)
    if isinstance(reward_model, str):
        reward_model = _parse_json_object(reward_model, "reward_model")
    if not isinstance(reward_model, dict):
        raise BadRowError(f"no ground truth: 'reward_model' must be a dict with a 'ground_truth' key, "
                          f"got {describe(reward_model)}")
    truth = reward_model.get("ground_truth")
    if truth is None:
        raise BadRowError(f"no ground truth: 'reward_model' has no non-null 'ground_truth' "
                          f"(keys: {sorted(reward_model)})")
    if isinstance(truth, bool) or not isinstance(truth, (str, int, float)):
        raise BadRowError(f"'reward_model.ground_truth' must be a string or a number, got {describe(truth)}; "
                          "Relax labels are flat strings, convert it before or inside your reward function")
    return truth if isinstance(truth, str) else str(truth)


def build_extra_info(row: dict) -> dict:
    """`extra_info` plus every unconsumed top-level column (`data_source`, `ability`, ...), which win."""
    extra = _to_python(row.get("extra_info"))
    if isinstance(extra, str):
        extra = _parse_json_object(extra, "extra_info")
    if extra is None:
        extra = {}
    if not isinstance(extra, dict):
        raise BadRowError(f"'extra_info' must be a dict (or a JSON object string), got {describe(extra)}")
    extra = dict(extra)
    for key, value in row.items():
        if key not in CONSUMED_COLUMNS and value is not None:
            extra[key] = _to_python(value)
    return extra


def extract_images(row: dict, *, md_dir: str | None = None) -> list | None:
    """The first non-empty image column as a list of bytes/paths; None when the row has no images."""
    for column in IMAGE_COLUMNS:
        items = _to_python(row.get(column))
        if items is None or items == []:
            continue
        if not isinstance(items, list):
            items = [items]
        return [_image_item(item, column, i, md_dir) for i, item in enumerate(items)]
    return None


def _image_item(item: Any, column: str, i: int, md_dir: str | None) -> bytes | str:
    if isinstance(item, dict):
        if item.get("bytes") is not None:
            item = item["bytes"]
        elif item.get("path") is not None:
            item = item["path"]
        else:
            raise BadRowError(f"'{column}' item {i} has neither 'bytes' nor 'path'")
    if isinstance(item, (bytes, bytearray)):
        return bytes(item)
    if isinstance(item, str) and item:
        return _join_path(item, md_dir)
    raise BadRowError(f"'{column}' item {i} must be bytes, a path string or a {{'bytes', 'path'}} dict, "
                      f"got {describe(item)}")


def _join_path(path: str, md_dir: str | None) -> str:
    if md_dir is None or os.path.isabs(path) or "://" in path or path.startswith("data:"):
        return path
    return os.path.join(md_dir, path)


# ---------------------------------------------------------------- files


def find_input_files(input_path: str) -> list[str]:
    """A `.parquet` file, or every `.parquet` file under a directory (sorted)."""
    return find_parquet_files(input_path, what="verl data", missing_hint="pass a verl .parquet file or a directory")


def convert_file(path: str, *, md_dir: str | None = None, skip_bad_rows: bool = False,
                 result: ConversionResult | None = None) -> ConversionResult:
    """Convert every row of one parquet file; a bad row raises `BadRowError` naming file and row index."""
    result = result if result is not None else ConversionResult()
    for index, row in enumerate(iter_parquet_rows(path)):
        result.num_in += 1
        try:
            result.rows.append(convert_row(row, md_dir=md_dir))
        except BadRowError as exc:
            reason = f"{path} (row {index}): {exc}"
            if not skip_bad_rows:
                raise BadRowError(f"{reason}. Fix the row, or pass --skip-bad-rows to skip such rows") from exc
            result.skipped.append(reason)
    return result


def write_rows(rows: list[dict], out_path: str) -> None:
    """Write rows as `.parquet` or `.jsonl`, chosen by the extension (bytes become data URLs in jsonl)."""
    if not out_path.endswith(OUTPUT_EXTENSIONS):
        raise ValueError(f"output {out_path!r} must end with one of {', '.join(OUTPUT_EXTENSIONS)}")
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    tmp_path = out_path + ".tmp"
    if out_path.endswith(".jsonl"):
        with open(tmp_path, "w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(_jsonable(row), ensure_ascii=False) + "\n")
    else:
        _write_parquet(rows, tmp_path)
    os.replace(tmp_path, out_path)


def _write_parquet(rows: list[dict], path: str) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pa.Table.from_pylist(rows)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        # extra_info values of different types across rows cannot share one struct column;
        # Relax also accepts metadata as a JSON-object string, so fall back to that.
        print(f"process_verl: extra_info has mixed value types ({exc}); writing it as JSON strings", file=sys.stderr)
        rows = [{**row, "extra_info": json.dumps(_jsonable(row["extra_info"]), ensure_ascii=False)} for row in rows]
        table = pa.Table.from_pylist(rows)
    pq.write_table(table, path)


def convert(input_path: str, output_path: str, *, md_dir: str | None = None,
            skip_bad_rows: bool = False) -> dict:
    """Convert a file or directory; return a summary {"rows_in", "rows_out", "skipped", "outputs", "reasons"}."""
    files = find_input_files(input_path)
    if output_path.endswith(OUTPUT_EXTENSIONS):
        result = ConversionResult()
        for path in files:
            convert_file(path, md_dir=md_dir, skip_bad_rows=skip_bad_rows, result=result)
        write_rows(result.rows, output_path)
        results, outputs = [result], [output_path]
    else:
        results, outputs = [], []
        for path in files:
            results.append(convert_file(path, md_dir=md_dir, skip_bad_rows=skip_bad_rows))
            relative = os.path.relpath(path, input_path) if os.path.isdir(input_path) else os.path.basename(path)
            outputs.append(os.path.join(output_path, relative))
            write_rows(results[-1].rows, outputs[-1])
    reasons = [reason for result in results for reason in result.skipped]
    return {"rows_in": sum(r.num_in for r in results), "rows_out": sum(len(r.rows) for r in results),
            "skipped": len(reasons), "outputs": outputs, "reasons": reasons}


# ---------------------------------------------------------------- helpers


def _to_python(value: Any) -> Any:
    """numpy arrays / scalars (pandas-read parquet) -> Python lists / scalars, recursively."""
    if hasattr(value, "tolist") and not isinstance(value, (bytes, str)):
        value = value.tolist()
    if isinstance(value, list):
        return [_to_python(v) for v in value]
    if isinstance(value, dict):
        return {k: _to_python(v) for k, v in value.items()}
    return value


def _parse_json_object(text: str, column: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadRowError(f"'{column}' is a string but not valid JSON ({exc.msg})") from exc
    if not isinstance(value, dict):
        raise BadRowError(f"'{column}' is a JSON string but not an object: {describe(value)}")
    return value


_MIME_MAGIC = ((b"\x89PNG", "image/png"), (b"\xff\xd8", "image/jpeg"), (b"GIF8", "image/gif"),
               (b"RIFF", "image/webp"), (b"BM", "image/bmp"))


def _data_url(data: bytes) -> str:
    mime = next((m for magic, m in _MIME_MAGIC if data.startswith(magic)), "application/octet-stream")
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


def _jsonable(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray)):
        return _data_url(bytes(value))
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


# ---------------------------------------------------------------- CLI


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="Convert verl-format parquet data to Relax rows.")
    parser.add_argument("--input-dir", required=True, help="a verl .parquet file or a directory of them")
    parser.add_argument("--output-dir", required=True,
                        help="output .parquet or .jsonl file (format by extension), or a directory "
                             "that gets one .parquet per input file")
    parser.add_argument("--md-dir", default=None, help="directory that relative image paths are joined onto")
    parser.add_argument("--skip-bad-rows", action="store_true",
                        help="skip (and count) rows that cannot be converted instead of failing")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        summary = convert(args.input_dir, args.output_dir, md_dir=args.md_dir, skip_bad_rows=args.skip_bad_rows)
    except (BadRowError, ValueError, FileNotFoundError) as exc:
        print(f"process_verl: error: {exc}", file=sys.stderr)
        return 1
    print_summary("process_verl", summary, converted="out", target=', '.join(summary['outputs']))
    return 0


if __name__ == "__main__":
    sys.exit(main())
