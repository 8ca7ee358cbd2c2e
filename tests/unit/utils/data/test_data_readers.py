"""read_rows / resolve_prompt_paths: file formats, path lists, slices and error messages."""

from __future__ import annotations

import pytest
from prompt_data_helpers import numbered_rows, write_jsonl, write_parquet

from relax.utils.data.readers import DataError, count_rows, read_rows, resolve_prompt_paths


def test_read_rows_jsonl_yields_one_based_line_numbers_and_skips_blank_lines(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"input": "a"}\n\n{"input": "b"}\n', encoding="utf-8")
    assert list(read_rows(str(path))) == [(1, {"input": "a"}), (3, {"input": "b"})]


def test_read_rows_parquet_yields_row_indices_and_nested_values(tmp_path):
    rows = [{"prompt": [{"role": "user", "content": "hi"}], "label": "1"},
            {"prompt": [{"role": "user", "content": "yo"}], "label": "2"}]
    path = write_parquet(tmp_path / "d.parquet", rows)
    assert list(read_rows(str(path))) == [(0, rows[0]), (1, rows[1])]


def test_read_rows_bad_json_names_file_and_line(tmp_path):
    path = write_jsonl(tmp_path / "bad.jsonl", [{"input": "ok"}, "{not json"])
    with pytest.raises(DataError, match=r"bad\.jsonl \(line 2\): invalid JSON"):
        list(read_rows(str(path)))


def test_read_rows_non_object_line_is_an_error(tmp_path):
    path = write_jsonl(tmp_path / "list.jsonl", ["[1, 2]"])
    with pytest.raises(DataError, match=r"line 1\): expected a JSON object"):
        list(read_rows(str(path)))


def test_read_rows_missing_file_names_the_flag(tmp_path):
    with pytest.raises(FileNotFoundError, match="--prompt-data"):
        list(read_rows(str(tmp_path / "nope.jsonl")))


def test_read_rows_unknown_extension_lists_supported_ones(tmp_path):
    path = tmp_path / "data.csv"
    path.write_text("a,b\n")
    with pytest.raises(ValueError, match=r"data\.csv.*\.jsonl, \.parquet"):
        list(read_rows(str(path)))


def test_resolve_prompt_paths_accepts_verl_style_list_strings_and_lists(tmp_path):
    a, b = str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet")
    assert resolve_prompt_paths(f"['{a}', '{b}']") == [a, b]
    assert resolve_prompt_paths(f'["{a}", "{b}"]') == [a, b]
    assert resolve_prompt_paths(f"[{a}, {b}]") == [a, b]
    assert resolve_prompt_paths([a, b]) == [a, b]
    assert resolve_prompt_paths(a) == [a]


def test_resolve_prompt_paths_expands_a_directory_in_sorted_order(tmp_path):
    write_jsonl(tmp_path / "b.jsonl", numbered_rows(1))
    write_parquet(tmp_path / "a.parquet", numbered_rows(1))
    (tmp_path / "notes.txt").write_text("ignored")
    assert resolve_prompt_paths(str(tmp_path)) == [str(tmp_path / "a.parquet"), str(tmp_path / "b.jsonl")]


def test_row_slice_keeps_the_selected_rows_with_their_real_line_numbers(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", numbered_rows(6))
    rows = list(read_rows(f"{path}@[2:4]"))
    assert [line for line, _ in rows] == [3, 4]
    assert [row["label"] for _, row in rows] == ["2", "3"]
    assert count_rows(f"{path}@[2:4]") == 2
    assert count_rows(str(path)) == 6
