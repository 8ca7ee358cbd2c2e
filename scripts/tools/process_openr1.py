"""Convert lmms-lab/multimodal-open-r1-8k-verified (parquet) into Relax prompt rows.

Usage:
    python3 scripts/tools/process_openr1.py \\
        --input-dir multimodal-open-r1-8k-verified/data/train-00000-of-00001.parquet \\
        --output-dir relax/openr1-train.parquet

The published dataset (one parquet file, 7.69k rows, split `train`) has the columns

| column              | content                                                            |
|---------------------|--------------------------------------------------------------------|
| `image`             | Hugging Face `Image` struct `{"bytes": <png/jpeg bytes>, "path": ...}` |
| `problem`           | the question text shown to the model                               |
| `solution`          | the verifiable answer, written as `<answer> ... </answer>`          |
| `original_question` | the question of the source set (Math360K / Geo170K)                |
| `original_answer`   | the source set's answer                                            |

Sources for this schema: the dataset card (https://huggingface.co/datasets/lmms-lab/multimodal-open-r1-8k-verified),
open-r1-multimodal's `src/open_r1/grpo.py` (reads `image`, `problem`, `solution`; its accuracy
reward strips `<answer>` tags from `solution`) and TRL's `examples/scripts/grpo_vlm.py` (removes
`problem`, `original_question`, `original_answer` and rewards on `solution`). The exact form of
`solution` was not checked against the file itself; any non-empty string is accepted and kept.

Per row (`convert_row`):

- `problem` -> `prompt`: `[{"role": "user", "content": "<image>" + problem}]` (no second
  placeholder when the problem already holds one);
- `image` -> `image`: a one-item list, the raw bytes (bytes win over `path`), or the path
  (`--md-dir` joins relative ones);
- `solution` -> `label`, unchanged (the `openr1mm` reward unwraps `<answer>`);
- `original_question`, `original_answer` -> `metadata`, a dict with both keys (null where missing).

Train with `--input-key prompt --label-key label --rm-type openr1mm --apply-chat-template
--multimodal-keys '{"image": "image"}'`. No answer-format instruction is added to the prompt: `openr1mm` scores 0
unless the response has one `<answer>...</answer>`, so say so with `--system-prompt`.

A row with a missing or empty `problem` / `solution`, or an `image` that is neither bytes, a path
nor a `{bytes, path}` struct holding one, stops the conversion with an error naming the file, the
0-based row index and the field; `--skip-bad-rows` skips and counts such rows instead. Output:
`.parquet` (image bytes stay bytes) or `.jsonl` (bytes become `data:<mime>;base64,...` URLs),
chosen by the extension of `--output-dir`.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # convert_common.py, next to this script
from convert_common import BadRowError, describe, find_parquet_files, iter_parquet_rows, print_summary  # noqa: E402

OUTPUT_EXTENSIONS = (".parquet", ".jsonl")
PLACEHOLDER = "<image>"
METADATA_COLUMNS = ("original_question", "original_answer")


# ---------------------------------------------------------------- one row


def convert_row(row: dict, *, md_dir: str | None = None) -> dict:
    """One OpenR1 row -> {"prompt", "image", "label", "metadata"}; `BadRowError` naming the field if bad."""
    if not isinstance(row, dict):
        raise BadRowError(f"expected a row dict, got {type(row).__name__}")
    problem = _text(row, "problem").strip()
    content = problem if PLACEHOLDER in problem else PLACEHOLDER + problem
    if content.count(PLACEHOLDER) != 1:
        raise BadRowError(f"field 'problem' holds {content.count(PLACEHOLDER)} {PLACEHOLDER} placeholders "
                          "for the row's one image")
    metadata = {key: row.get(key) for key in METADATA_COLUMNS}  # every key in every row: one parquet struct
    return {"prompt": [{"role": "user", "content": content}], "image": [image_item(row.get("image"), md_dir)],
            "label": _text(row, "solution"), "metadata": metadata}


def _text(row: dict, field: str) -> str:
    value = row.get(field)
    if not isinstance(value, str) or not value.strip():
        raise BadRowError(f"field {field!r} must be a non-empty string, got {describe(value)}")
    return value


def image_item(image: Any, md_dir: str | None = None) -> bytes | str:
    """The row's image as raw bytes, or as a path (relative paths joined onto `md_dir`)."""
    if isinstance(image, dict):
        image = image.get("bytes") if image.get("bytes") is not None else image.get("path")
    if isinstance(image, (bytes, bytearray)) and image:
        return bytes(image)
    if isinstance(image, str) and image:
        return image if md_dir is None or os.path.isabs(image) or "://" in image else os.path.join(md_dir, image)
    raise BadRowError(f"field 'image' must be image bytes, a path, or a {{'bytes', 'path'}} struct holding one, "
                      f"got {describe(image)}")


# ---------------------------------------------------------------- files


def find_input_files(input_path: str) -> list[str]:
    """A `.parquet` file, or every `.parquet` file under a directory (sorted)."""
    return find_parquet_files(input_path, what="the OpenR1 dataset", missing_hint="pass the dataset's .parquet file")


def convert(input_path: str, output_path: str, *, md_dir: str | None = None, skip_bad_rows: bool = False) -> dict:
    """Convert every row; return {"rows_in", "rows_out", "skipped", "reasons", "output"}."""
    if not output_path.endswith(OUTPUT_EXTENSIONS):
        raise ValueError(f"--output-dir {output_path!r} must end with one of {', '.join(OUTPUT_EXTENSIONS)}")
    rows, reasons, rows_in = [], [], 0
    for path in find_input_files(input_path):
        for index, row in enumerate(iter_parquet_rows(path)):
            rows_in += 1
            try:
                rows.append(convert_row(row, md_dir=md_dir))
            except BadRowError as exc:
                reason = f"{path} (row {index}): {exc}"
                if not skip_bad_rows:
                    raise BadRowError(f"{reason}. Fix the row, or pass --skip-bad-rows to skip such rows") from exc
                reasons.append(reason)
    write_rows(rows, output_path)
    return {"rows_in": rows_in, "rows_out": len(rows), "skipped": len(reasons), "reasons": reasons,
            "output": output_path}


def write_rows(rows: list[dict], out_path: str) -> None:
    """`.parquet` or `.jsonl` by extension, through a temporary file (no half-written output)."""
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    tmp_path = out_path + ".tmp"
    if out_path.endswith(".jsonl"):
        with open(tmp_path, "w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(_jsonable(row), ensure_ascii=False) + "\n")
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            table = pa.Table.from_pylist(rows)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise ValueError(f"cannot write {out_path}: images mix bytes and paths across rows ({exc}); "
                             "write .jsonl instead (bytes become data URLs there)") from exc
        pq.write_table(table, tmp_path)
    os.replace(tmp_path, out_path)


# ---------------------------------------------------------------- helpers


_MIME_MAGIC = ((b"\x89PNG", "image/png"), (b"\xff\xd8", "image/jpeg"), (b"GIF8", "image/gif"),
               (b"RIFF", "image/webp"), (b"BM", "image/bmp"))


def _jsonable(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray)):
        mime = next((m for magic, m in _MIME_MAGIC if value.startswith(magic)), "application/octet-stream")
        return f"data:{mime};base64,{base64.b64encode(bytes(value)).decode('ascii')}"
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    return value


# ---------------------------------------------------------------- CLI


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Convert lmms-lab/multimodal-open-r1-8k-verified parquet to Relax rows "
                    "(prompt with <image>, image, label for --rm-type openr1mm).")
    parser.add_argument("--input-dir", required=True, help="the dataset's .parquet file, or a directory of them")
    parser.add_argument("--output-dir", required=True, help="output file: .parquet or .jsonl (format by extension)")
    parser.add_argument("--md-dir", default=None, help="directory that relative image paths are joined onto")
    parser.add_argument("--skip-bad-rows", action="store_true",
                        help="skip (and count) rows that cannot be converted instead of failing")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        summary = convert(args.input_dir, args.output_dir, md_dir=args.md_dir, skip_bad_rows=args.skip_bad_rows)
    except (ValueError, FileNotFoundError) as exc:
        print(f"process_openr1: error: {exc}", file=sys.stderr)
        return 1
    print_summary("process_openr1", summary, converted="converted", target=summary['output'])
    return 0


if __name__ == "__main__":
    sys.exit(main())
