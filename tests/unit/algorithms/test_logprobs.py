"""One-row response log-probs (the true on-policy contract), against hand-computed numbers."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from relax.algorithms.logprobs import row_response_log_probs, row_response_logits, token_log_probs


class TableModel:
    """A fake causal LM: position p's logits are LOGITS_LV[p]; records what it was called with."""

    LOGITS_LV = torch.tensor([[0.0, 0.0, 0.0], [1.0, 0.0, 0.0], [0.0, 2.0, 0.0], [0.0, 0.0, 3.0]])

    def __init__(self):
        self.calls = []

    def __call__(self, *, input_ids, use_cache, logits_to_keep):
        self.calls.append((input_ids.tolist(), use_cache, logits_to_keep))
        length = input_ids.shape[1]
        return SimpleNamespace(logits=self.LOGITS_LV[:length][-logits_to_keep:][None])


def _log_softmax_at(row, token, temperature):
    z = [v / temperature for v in row]
    return z[token] - math.log(sum(math.exp(v) for v in z))


def test_scores_the_response_tokens_of_one_unpadded_row():
    model = TableModel()
    tokens = [7, 1, 2, 0]  # prompt [7, 1], response [2, 0]: predicted at positions 1 and 2
    got = row_response_log_probs(model, tokens, 2, temperature=0.5)
    rows = TableModel.LOGITS_LV.tolist()
    expected = [_log_softmax_at(rows[1], 2, 0.5), _log_softmax_at(rows[2], 0, 0.5)]
    assert got.tolist() == pytest.approx(expected, abs=1e-6)
    # one row, no cache, every position through the head (the head's row count changes its bits)
    assert model.calls == [([tokens], False, 0)]


def test_logits_are_float32_and_temperature_scaled():
    logits_RV = row_response_logits(TableModel(), [5, 5, 5], 1, temperature=2.0)
    assert logits_RV.dtype == torch.float32 and logits_RV.tolist() == [[0.5, 0.0, 0.0]]  # position 1 / 2
    assert token_log_probs(logits_RV, [0]).tolist() == pytest.approx([_log_softmax_at([1, 0, 0], 0, 2.0)])


def test_empty_response_gives_no_log_probs():
    assert row_response_log_probs(TableModel(), [1, 2], 0, temperature=1.0).shape == (0,)


@pytest.mark.parametrize("length, temperature, needle", [(2, 1.0, "response_length"), (-1, 1.0, "response_length"),
                                                         (1, 0.0, "temperature")])
def test_bad_arguments_are_named(length, temperature, needle):
    with pytest.raises(ValueError, match=needle):
        row_response_logits(TableModel(), [1, 2], length, temperature)
