from relax.engine.rewards.extract import label_text, last_boxed, tag_blocks, unwrap_tag


def test_last_boxed_takes_the_last_box_with_nested_braces():
    assert last_boxed(r"first \boxed{1} then \boxed{\frac{1}{2}} done") == r"\frac{1}{2}"


def test_last_boxed_reads_fbox_and_braceless_form():
    assert last_boxed(r"\fbox{7}") == "7"
    assert last_boxed(r"so $\boxed 5$") == "5"


def test_last_boxed_is_none_without_box_or_when_unclosed():
    assert last_boxed("the answer is 5") is None
    assert last_boxed(r"\boxed{\frac{1}{2}") is None


def test_tag_blocks_and_unwrap_tag():
    assert tag_blocks("<answer>A</answer> x <answer> B </answer>", "answer") == ["A", " B "]
    assert unwrap_tag("<answer>B</answer>", "answer") == "B"
    assert unwrap_tag(" B ", "answer") == "B"


def test_label_text_unwraps_boxed_labels_and_numbers():
    assert label_text(r"\boxed{42}") == "42"
    assert label_text(0.5) == "0.5"
