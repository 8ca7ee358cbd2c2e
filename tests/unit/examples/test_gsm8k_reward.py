"""examples/gsm8k: the verl-ported gsm8k scorer, its async reward_func, and offline data preparation."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pyarrow.parquet as pq
import pytest

from examples.gsm8k.reward_gsm8k import compute_score, extract_answer, reward_func
from relax.utils.types import Sample


@pytest.mark.parametrize("response, expected", [
    ("Natalia sold 48/2 = 24 clips in May.\n48+24 = 72\n#### 72", "72"),
    ("#### 1,234", "1234"),
    ("The total is $18.\n#### $18", "18"),
    ("#### -5", "-5"),
    ("first #### 3 then corrected #### 4", "4"),
    ("She has 5 apples, then 7. The answer is 12.", "12"),  # flexible: the last number
    ("no digits here", None),
])
def test_extract_answer_prefers_marker_then_last_number(response, expected):
    assert extract_answer(response) == expected


def test_strict_method_needs_the_marker():
    assert extract_answer("The answer is 12.", method="strict") is None
    assert extract_answer("so #### 12", method="strict") == "12"
    with pytest.raises(ValueError, match="gsm8k_method"):
        extract_answer("12", method="fuzzy")


@pytest.mark.parametrize("response, label, score, acc", [
    ("48+24 = 72\n#### 72", "72", 1.0, True),
    ("#### 72.0", "72", 1.0, True),
    ("#### 1,000", "1000", 1.0, True),
    ("#### 71", "72", 0.0, False),
    ("I don't know", "72", 0.0, False),
])
def test_compute_score_public_style_cases(response, label, score, acc):
    result = compute_score(response, label)
    assert result["score"] == score and result["acc"] is acc


def test_compute_score_wrong_answer_gets_format_score_but_no_answer_gets_zero():
    assert compute_score("#### 7", "72", format_score=0.1) == {"score": 0.1, "acc": False, "pred": "7"}
    assert compute_score("nothing", "72", format_score=0.1) == {"score": 0.0, "acc": False, "pred": None}


def test_reward_func_scores_sample_with_args_options():
    sample = Sample(prompt="q", response="6*12 = 72\n#### 72", label="72", metadata={"data_source": "openai/gsm8k"})
    assert asyncio.run(reward_func(SimpleNamespace(), sample)) == {"score": 1.0, "acc": True, "pred": "72"}

    args = SimpleNamespace(gsm8k_method="strict", gsm8k_format_score=0.0, gsm8k_correct_score=2.0)
    assert asyncio.run(reward_func(args, sample))["score"] == 2.0
    no_marker = Sample(response="it is 72", label="72")
    assert asyncio.run(reward_func(args, no_marker))["score"] == 0.0


def test_reward_func_passes_the_plugin_signature_check():
    from relax.utils.plugins import load_plugin

    load_plugin("examples.gsm8k.reward_gsm8k.reward_func", flag="--custom-rm-path", positional=2,
                expected="reward_func(args, sample, **kwargs)")


def test_prepare_data_writes_synthetic_verl_then_relax_rows(tmp_path):
    from examples.gsm8k.prepare_data import prepare

    outputs = prepare(str(tmp_path), num_train=16, num_test=4, seed=1)
    verl = pq.read_table(tmp_path / "verl" / "train.parquet").to_pylist()
    relax_rows = pq.read_table(outputs["train"]).to_pylist()
    assert len(relax_rows) == 16 and len(pq.read_table(outputs["test"])) == 4
    for source, row in zip(verl, relax_rows):
        assert row["label"] == source["reward_model"]["ground_truth"]
        assert row["extra_info"]["data_source"] == "openai/gsm8k"
        assert row["prompt"][0]["content"].endswith('output the final answer after "####".')
        # The worked solution in extra_info scores 1.0 against the label.
        assert compute_score(row["extra_info"]["answer"], row["label"])["acc"] is True
