import json

import pytest

from relax.engine.rewards import ifbench


def _meta(*pairs, **extra):
    return {"instruction_id_list": [iid for iid, _ in pairs], "kwargs": [kw for _, kw in pairs], **extra}


@pytest.mark.parametrize("iid, kwargs, good, bad", [
    ("length_constraints:number_words", {"relation": "less than", "num_words": 4}, "one two three", "a b c d e"),
    ("length_constraints:number_words", {"relation": "at least", "num_words": 3}, "one two three", "one two"),
    ("length_constraints:number_sentences", {"relation": "exactly", "num_sentences": 2}, "Hi. Bye!", "Hi. Bye. Ok?"),
    ("keywords:existence", {"keywords": ["cat", "dog"]}, "A Cat and a dog", "a cat"),
    ("keywords:frequency", {"keyword": "yes", "frequency": 2, "relation": "at least"}, "yes YES", "yes"),
    ("keywords:forbidden_words", {"forbidden_words": ["bad"]}, "badge is fine", "that is Bad"),
    ("punctuation:no_comma", None, "no commas here", "a, b"),
    ("change_case:english_lowercase", None, "all lower", "Not lower"),
    ("change_case:english_capital", None, "ALL UPPER", "Not upper"),
    ("detectable_format:json_format", None, '```json\n{"a": 1}\n```', "{a: 1}"),
    ("detectable_format:number_bullet_lists", {"num_bullets": 2}, "* one\n* two", "* one\n- two\n- three"),
    ("detectable_format:title", None, "<<My Title>>\ntext", "My Title\ntext"),
    ("startend:end_checker", {"end_phrase": "Any other questions?"}, "Done. any other questions?", "Done."),
    ("startend:start_checker", {"start_phrase": "Dear"}, "dear team", "Hello"),
    ("startend:quotation", None, '"quoted"', "not quoted"),
])
def test_each_instruction_accepts_good_and_rejects_bad(iid, kwargs, good, bad):
    metadata = _meta((iid, kwargs))
    assert ifbench.score(good, None, metadata) == 1.0
    assert ifbench.score(bad, None, metadata) == 0.0


def test_score_is_the_fraction_followed():
    metadata = _meta(("punctuation:no_comma", None), ("change_case:english_lowercase", None))
    assert ifbench.score("lower, with comma", None, metadata) == 0.5


def test_strict_flag_requires_all_followed():
    metadata = _meta(("punctuation:no_comma", None), ("change_case:english_lowercase", None), strict=True)
    assert ifbench.score("lower, with comma", None, metadata) == 0.0
    assert ifbench.score("lower no comma", None, metadata) == 1.0


def test_instructions_may_come_from_a_json_label():
    label = json.dumps(_meta(("punctuation:no_comma", None)))
    assert ifbench.score("no comma", label, {}) == 1.0


def test_unknown_instruction_id_raises_listing_supported_ids():
    with pytest.raises(ValueError, match="unknown instruction id 'language:response_language'.*supported"):
        ifbench.score("x", None, _meta(("language:response_language", {"language": "en"})))


def test_missing_kwargs_key_and_bad_relation_raise():
    with pytest.raises(ValueError, match="num_words"):
        ifbench.score("x", None, _meta(("length_constraints:number_words", {"relation": "at least"})))
    with pytest.raises(ValueError, match="relation"):
        ifbench.score("x", None, _meta(("length_constraints:number_words", {"relation": "about", "num_words": 1})))


def test_row_without_instructions_raises():
    with pytest.raises(ValueError, match="instruction_id_list"):
        ifbench.score("x", "plain label", {})
