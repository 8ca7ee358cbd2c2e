"""Convert AVQA-R1-6K (`omni_rl_format_{train,valid}.json`) into Relax prompt rows (image + audio).

Usage:
    python3 scripts/tools/process_avqa.py \\
        --input-dir AVQA-R1-6K/AVQA_R1/train/omni_rl_format_train.json \\
        --output-dir AVQA-R1-6K/AVQA_R1/train/omni_rl_format_train_relax.jsonl \\
        --md-dir AVQA-R1-6K/AVQA_R1/train

The published file (harryhsing/AVQA-R1-6K, `AVQA_R1/{train,valid}/`, next to `images/` and
`audios/`) is one JSON list of records written by EchoInk's `src/make_omniInstruct_r1_dataset.py`
(https://github.com/HarryHsing/EchoInk), which this schema is taken from (values illustrative):

    {"problem_id": 12, "problem": "What is the man doing?", "data_type": "image_audio",
     "problem_type": "multiple choice", "options": ["A. singing", "B. talking", "C. ...", "D. ..."],
     "solution": "<answer>B</answer>",
     "path": {"image": "images/sample_12.jpg", "audio": "audios/sample_12.wav"},
     "data_source": "OmniInstruct_v1-AVQA"}

Per record (`convert_record`):

- `problem`, `options` -> `prompt`: `[{"role": "user", "content": "<image><audio>" + problem +
  "\\nOptions:\\n" + one option per line}]`;
- `path.image` -> `image_key`: `[path]` (`--md-dir` joins relative paths); `path.audio` -> `audio_key`;
- `solution` (`<answer>B</answer>` or `B`) -> `label`: the option letter, `"B"` (it must name an option);
- `problem_id`, `problem_type`, `data_source` -> `metadata`, a dict.

Options are used as written when each starts with its letter (`A. ...`, `(B) ...`, `C) ...`);
otherwise they are lettered A, B, C, ... by position. Train with `--input-key prompt --label-key
label --rm-type multiple_choice --apply-chat-template
--multimodal-keys '{"image": "image_key", "audio": "audio_key"}'`. The media files themselves are
not opened here; Relax's loader checks each one when it loads the rows.

A record that is not an object, has an empty `problem`, no options, a `solution` that names no
option, a `data_type` other than `image_audio`, or no `path.image` / `path.audio` stops the
conversion with an error naming the file, the 0-based record index and the field;
`--skip-bad-rows` skips and counts such records instead. Output: `.jsonl` or `.parquet`, by the
extension of `--output-dir`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # convert_common.py, next to this script
from convert_common import BadRowError, describe, print_summary  # noqa: E402

OUTPUT_EXTENSIONS = (".jsonl", ".parquet")
METADATA_FIELDS = ("problem_id", "problem_type", "data_source")
_OPTION_LETTER = re.compile(r"^\s*\(?([A-Za-z])\s*[.):]\s*")
_ANSWER = re.compile(r"^\s*(?:<answer>\s*)?\(?([A-Za-z])\)?\.?\s*(?:</answer>)?\s*$")


# ---------------------------------------------------------------- one record


def convert_record(record: Any, *, md_dir: str | None = None) -> dict:
    """One AVQA record -> {"prompt", "image_key", "audio_key", "label", "metadata"}; `BadRowError` if bad."""
    if not isinstance(record, dict):
        raise BadRowError(f"expected a JSON object, got {describe(record)}")
    if record.get("data_type", "image_audio") != "image_audio":
        raise BadRowError(f"field 'data_type' is {record['data_type']!r}; only 'image_audio' records are converted")
    problem = record.get("problem")
    if not isinstance(problem, str) or not problem.strip():
        raise BadRowError(f"field 'problem' must be a non-empty string, got {describe(problem)}")
    letters, lines = lettered_options(record.get("options"))
    label = answer_letter(record.get("solution"), letters)
    content = f"<image><audio>{problem.strip()}\nOptions:\n" + "\n".join(lines)
    return {"prompt": [{"role": "user", "content": content}],
            "image_key": [media_path(record, "image", md_dir)], "audio_key": [media_path(record, "audio", md_dir)],
            "label": label, "metadata": {key: record.get(key) for key in METADATA_FIELDS}}


def lettered_options(options: Any) -> tuple[list[str], list[str]]:
    """(the option letters, the option lines as shown in the prompt)."""
    if not isinstance(options, list) or not options or not all(isinstance(o, str) and o.strip() for o in options):
        raise BadRowError(f"field 'options' must be a non-empty list of non-empty strings, got {describe(options)}")
    matches = [_OPTION_LETTER.match(option) for option in options]
    if all(matches):
        letters = [m.group(1).upper() for m in matches]
        lines = [option.strip() for option in options]
    else:  # unlettered options: letter them by position
        letters = [chr(ord("A") + i) for i in range(len(options))]
        lines = [f"{letter}. {option.strip()}" for letter, option in zip(letters, options)]
    if len(set(letters)) != len(letters):
        raise BadRowError(f"field 'options' repeats an option letter: {letters}")
    return letters, lines


def answer_letter(solution: Any, letters: list[str]) -> str:
    """The option letter of `solution` (`<answer>B</answer>`, `B`, `(B)`), which must be one of `letters`."""
    match = _ANSWER.match(solution) if isinstance(solution, str) else None
    if match is None:
        raise BadRowError(f"field 'solution' must be one option letter, e.g. '<answer>B</answer>', "
                          f"got {describe(solution)}")
    letter = match.group(1).upper()
    if letter not in letters:
        raise BadRowError(f"field 'solution' answers {letter}, which is not one of the options {letters}")
    return letter


def media_path(record: dict, kind: str, md_dir: str | None) -> str:
    """`record["path"][kind]`, joined onto `md_dir` when relative."""
    paths = record.get("path")
    value = paths.get(kind) if isinstance(paths, dict) else None
    if not isinstance(value, str) or not value.strip():
        raise BadRowError(f"field 'path.{kind}' must be a non-empty file path, got {describe(value)} "
                          f"(field 'path' is {describe(paths)})")
    if md_dir is None or os.path.isabs(value) or "://" in value:
        return value
    return os.path.join(md_dir, value)


# ---------------------------------------------------------------- files


def read_records(path: str) -> list:
    """The JSON list of records in `path`."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"--input-dir {path!r} is not a file; pass omni_rl_format_train.json "
                                "(or omni_rl_format_valid.json)")
    with open(path, encoding="utf-8") as f:
        try:
            records = json.load(f)
        except json.JSONDecodeError as exc:
            raise ValueError(f"--input-dir {path!r} is not valid JSON ({exc}); AVQA-R1-6K ships one JSON list "
                             "per split") from exc
    if not isinstance(records, list):
        raise ValueError(f"--input-dir {path!r} holds a JSON {type(records).__name__}, expected a list of records")
    return records


def convert(input_path: str, output_path: str, *, md_dir: str | None = None, skip_bad_rows: bool = False) -> dict:
    """Convert every record; return {"rows_in", "rows_out", "skipped", "reasons", "output"}."""
    if not output_path.endswith(OUTPUT_EXTENSIONS):
        raise ValueError(f"--output-dir {output_path!r} must end with one of {', '.join(OUTPUT_EXTENSIONS)}")
    records = read_records(input_path)
    rows, reasons = [], []
    for index, record in enumerate(records):
        try:
            rows.append(convert_record(record, md_dir=md_dir))
        except BadRowError as exc:
            reason = f"{input_path} (record {index}): {exc}"
            if not skip_bad_rows:
                raise BadRowError(f"{reason}. Fix the record, or pass --skip-bad-rows to skip such records") from exc
            reasons.append(reason)
    write_rows(rows, output_path)
    return {"rows_in": len(records), "rows_out": len(rows), "skipped": len(reasons), "reasons": reasons,
            "output": output_path}


def write_rows(rows: list[dict], out_path: str) -> None:
    """`.jsonl` or `.parquet` by extension, through a temporary file (no half-written output)."""
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    tmp_path = out_path + ".tmp"
    if out_path.endswith(".jsonl"):
        with open(tmp_path, "w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        # metadata values may differ in type across records (problem_id int or str): keep them as JSON text
        rows = [{**row, "metadata": json.dumps(row["metadata"], ensure_ascii=False)} for row in rows]
        pq.write_table(pa.Table.from_pylist(rows), tmp_path)
    os.replace(tmp_path, out_path)


# ---------------------------------------------------------------- CLI


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Convert AVQA-R1-6K omni_rl_format_*.json to Relax rows (prompt with <image><audio>, "
                    "image_key, audio_key, an option-letter label for --rm-type multiple_choice).")
    parser.add_argument("--input-dir", required=True,
                        help="the split's JSON file, e.g. .../train/omni_rl_format_train.json")
    parser.add_argument("--output-dir", required=True, help="output file: .jsonl or .parquet (format by extension)")
    parser.add_argument("--md-dir", default=None,
                        help="directory holding images/ and audios/; relative media paths are joined onto it "
                             "(default: keep them relative)")
    parser.add_argument("--skip-bad-rows", action="store_true",
                        help="skip (and count) records that cannot be converted instead of failing")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        summary = convert(args.input_dir, args.output_dir, md_dir=args.md_dir, skip_bad_rows=args.skip_bad_rows)
    except (ValueError, FileNotFoundError) as exc:
        print(f"process_avqa: error: {exc}", file=sys.stderr)
        return 1
    print_summary("process_avqa", summary, converted="converted", target=summary['output'])
    return 0


if __name__ == "__main__":
    sys.exit(main())
