"""The tiny_math task: name the largest number in a short list of digits.

A prompt lists `min_len..max_len` single digits and asks for the largest one in `\\boxed{}`:

    Find the largest number: 3, 8, 1, 5. Put the final answer in \\boxed{}.
    -> The largest is \\boxed{8}.                                     (label "8")

Why this task: a model of ~0.2 M parameters can learn it from reward alone within a few
hundred GRPO steps and it generalises to unseen lists (comparison is a rule, not a lookup);
answers are one digit, so responses are ~9 tokens and rollouts are cheap on a CPU; and a
briefly warm-started policy already scores ~0.2 at T=1, which gives GRPO the non-zero
reward variance it needs from the first step.

Rows use the Relax data format (`--input-key prompt --label-key label
--apply-chat-template`): `{"prompt": [{"role": "user", "content": ...}], "label": "8"}`.
The reward is the built-in `math` reward (last `\\boxed{...}` equals the label);
`boxed_reward` here is an exact stand-in used by prepare's evaluation and the tests.
"""

from __future__ import annotations

import random
import re
from typing import Any

INSTRUCTION = "Put the final answer in \\boxed{}."
PROMPT_PREFIX = "Find the largest number: "
RESPONSE_PREFIX = "The largest is "
_BOXED_RE = re.compile(r"\\boxed\{([^{}]*)\}")


def sample_numbers(rng: random.Random, *, min_len: int = 3, max_len: int = 5) -> tuple[int, ...]:
    """A list of `min_len..max_len` digits whose maximum is uniform over 1-9.

    Drawing the maximum first (then the rest from 0..max, at random positions) matters: with
    i.i.d. digits the answer is 9 about a third of the time, and both SFT and GRPO fall into
    the "always answer 9" shortcut instead of learning to compare.
    """
    if not 1 <= min_len <= max_len:
        raise ValueError(f"need 1 <= min_len <= max_len, got min_len={min_len}, max_len={max_len}")
    length = rng.randint(min_len, max_len)
    largest = rng.randint(1, 9)
    numbers = [rng.randint(0, largest) for _ in range(length - 1)]
    numbers.insert(rng.randint(0, length - 1), largest)
    return tuple(numbers)


def prompt_text(numbers: tuple[int, ...]) -> str:
    return PROMPT_PREFIX + ", ".join(str(n) for n in numbers) + ". " + INSTRUCTION


def answer_of(numbers: tuple[int, ...]) -> str:
    return str(max(numbers))


def response_text(answer: str) -> str:
    """The response format the SFT warm start teaches (a `\\boxed{}` answer, ~9 tokens)."""
    return RESPONSE_PREFIX + "\\boxed{" + answer + "}."


def make_row(numbers: tuple[int, ...]) -> dict[str, Any]:
    """One data row in the Relax format."""
    return {"prompt": [{"role": "user", "content": prompt_text(numbers)}], "label": answer_of(numbers)}


def make_splits(
    *, n_train: int, n_eval: int, seed: int, min_len: int = 3, max_len: int = 5
) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]]]:
    """Distinct number lists for train and held-out eval; no eval list appears in train.

    Eval lists are drawn first and are unique; train lists are drawn from what remains
    (train may repeat a list, as real datasets do, but never an eval one).
    """
    space = sum(10**k for k in range(min_len, max_len + 1))
    if n_eval > space // 2:
        raise ValueError(f"n_eval={n_eval} is more than half of the {space} possible lists; lower it")
    rng = random.Random(seed)
    eval_lists: list[tuple[int, ...]] = []
    seen: set[tuple[int, ...]] = set()
    while len(eval_lists) < n_eval:
        numbers = sample_numbers(rng, min_len=min_len, max_len=max_len)
        if numbers not in seen:
            seen.add(numbers)
            eval_lists.append(numbers)
    train_lists: list[tuple[int, ...]] = []
    while len(train_lists) < n_train:
        numbers = sample_numbers(rng, min_len=min_len, max_len=max_len)
        if numbers not in seen:
            train_lists.append(numbers)
    return train_lists, eval_lists


def format_target(numbers: tuple[int, ...], rng: random.Random, *, correct_frac: float) -> str:
    """The SFT target for one list: the true answer with probability `correct_frac`, else a
    uniformly chosen listed number (a format-only target: box one of the listed numbers).

    prepare uses `correct_frac=1` and stops SFT early; lower values are kept for experiments
    (note that a 2-layer, 64-wide model does not learn the copy-a-listed-number target within
    a few hundred steps and ends near 0.1 accuracy, from which GRPO barely moves).
    """
    answer = answer_of(numbers) if rng.random() < correct_frac else str(rng.choice(numbers))
    return response_text(answer)


def last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` in `text` (no nested braces), or None."""
    found = _BOXED_RE.findall(text)
    return found[-1].strip() if found else None


def boxed_reward(response: str, label: str) -> float:
    """1.0 when the last boxed answer equals the label, else 0.0 (stand-in for `--rm-type math`)."""
    return 1.0 if last_boxed(response) == str(label).strip() else 0.0


def tokenizer_corpus(seed: int = 0, n: int = 2000) -> list[str]:
    """Text the tokenizer is trained on: this task's prompts and responses with ChatML role names
    (the special tokens themselves are added, not learned)."""
    rng = random.Random(seed)
    texts = []
    for _ in range(n):
        numbers = sample_numbers(rng)
        texts.append(f"user\n{prompt_text(numbers)}\nassistant\n")
        texts.append(response_text(answer_of(numbers)) + "\n")
    texts.append("system\nYou are a helpful assistant.\n")
    return texts
