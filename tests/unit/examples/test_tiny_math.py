"""tiny_math task rows, reward stand-in, and the prepare CLI on a tiny setting."""

from __future__ import annotations

import json
import random

import pytest

from examples.tiny_math.task import (
    INSTRUCTION,
    answer_of,
    boxed_reward,
    format_target,
    last_boxed,
    make_row,
    make_splits,
    response_text,
    sample_numbers,
)


def test_rows_have_relax_prompt_messages_and_string_label():
    row = make_row((3, 8, 1, 5))
    assert row == {
        "prompt": [{"role": "user", "content": "Find the largest number: 3, 8, 1, 5. " + INSTRUCTION}],
        "label": "8",
    }
    assert json.loads(json.dumps(row)) == row
    assert row["prompt"][0]["content"].endswith("Put the final answer in \\boxed{}.")


def test_labels_are_the_maximum_of_the_listed_numbers():
    rng = random.Random(0)
    for _ in range(200):
        numbers = sample_numbers(rng, min_len=3, max_len=5)
        assert 3 <= len(numbers) <= 5 and all(0 <= n <= 9 for n in numbers)
        row = make_row(numbers)
        listed = [int(x) for x in row["prompt"][0]["content"].split(":")[1].split(".")[0].split(",")]
        assert row["label"] == str(max(listed))


def test_answer_distribution_is_not_dominated_by_nine():
    rng = random.Random(1)
    answers = [answer_of(sample_numbers(rng)) for _ in range(3000)]
    assert answers.count("9") / len(answers) < 0.2
    assert set(answers) == {str(d) for d in range(1, 10)}


def test_eval_lists_are_unique_and_disjoint_from_train():
    train, held_out = make_splits(n_train=3000, n_eval=300, seed=7)
    assert len(train) == 3000 and len(held_out) == 300
    assert len(set(held_out)) == 300
    assert not set(held_out) & set(train)
    assert make_splits(n_train=3000, n_eval=300, seed=7) == (train, held_out)


def test_too_many_eval_rows_for_the_list_space_is_rejected():
    with pytest.raises(ValueError, match="n_eval"):
        make_splits(n_train=1, n_eval=100, seed=0, min_len=2, max_len=2)


def test_boxed_reward_reads_the_last_box_only():
    assert boxed_reward(response_text("7"), "7") == 1.0
    assert boxed_reward("\\boxed{7} no, \\boxed{9}", "7") == 0.0
    assert boxed_reward("the answer is 7", "7") == 0.0
    assert last_boxed("x \\boxed{ 4 } y") == "4"


def test_sft_target_is_correct_at_fraction_one_and_a_listed_number_at_zero():
    rng = random.Random(0)
    numbers = (2, 6, 4)
    assert {format_target(numbers, rng, correct_frac=1.0) for _ in range(20)} == {response_text("6")}
    picked = {last_boxed(format_target(numbers, rng, correct_frac=0.0)) for _ in range(200)}
    assert picked == {"2", "6", "4"}


def test_prepare_writes_loadable_outputs_and_skips_when_unchanged(tmp_path, capsys):
    pytest.importorskip("transformers")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from examples.tiny_math.prepare import MODEL_SUBDIR, main

    argv = ["--out-dir", str(tmp_path), "--seed", "3", "--sft-steps", "4", "--sft-check-every", "2",
            "--n-train", "200", "--n-eval", "16", "--hidden-size", "32", "--num-layers", "1"]
    main(argv)
    assert "prepared" in capsys.readouterr().out
    train = [json.loads(line) for line in (tmp_path / "data" / "train.jsonl").read_text().splitlines()]
    held_out = [json.loads(line) for line in (tmp_path / "data" / "eval.jsonl").read_text().splitlines()]
    assert len(train) == 200 and len(held_out) == 16
    assert not {r["prompt"][0]["content"] for r in held_out} & {r["prompt"][0]["content"] for r in train}

    model_dir = tmp_path / MODEL_SUBDIR
    record = json.loads((model_dir / "prepare.json").read_text())
    assert record["settings"]["seed"] == 3 and record["sft_steps_run"] <= 4
    assert record["sft_final_loss"] < record["sft_first_loss"]
    assert 0.0 <= record["eval_sampled_t1"]["accuracy"] <= 1.0
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir))
    assert model.config.eos_token_id == tokenizer.eos_token_id == tokenizer.convert_tokens_to_ids("<|im_end|>")

    stamp = (model_dir / "model.safetensors").stat().st_mtime_ns
    main(argv)
    assert "already prepared" in capsys.readouterr().out
    assert (model_dir / "model.safetensors").stat().st_mtime_ns == stamp
    main(argv + ["--force"])
    assert (model_dir / "model.safetensors").stat().st_mtime_ns != stamp
