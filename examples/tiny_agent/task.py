"""The tiny_agent task: a price only a lookup tool knows.

Each row has its own random price list (a digit per item, kept in the row's metadata, never in
the prompt). The prompt names one item; the answer needs the tool:

    system   You are a shop assistant. Call lookup for prices.  (prepare --tools-in-prompt 1: + the
             `lookup` tool's schema, as Qwen's template renders tools)
    user     What is the price of plum? Answer with \\boxed{}.
    assistant  <tool_call>\\n{"name": "lookup", "arguments": {"item": "plum"}}\\n</tool_call>
    tool     plum: 7                      (a <tool_response> in a user turn, Qwen's format)
    assistant  The price is \\boxed{7}.    (label "7"; the built-in math reward checks it)

Without the tool the answer is a guess (1 in 9). The SFT warm start (sft.py) sees this tool path
in only `tool_frac` of its demonstrations and a direct guess in the rest, so the start policy
calls the tool rarely; multi-turn GRPO then has to discover that calling it pays.
"""

from __future__ import annotations

import json
import random
from typing import Any

ITEMS = ("apple", "plum", "fig", "kiwi", "lime", "pear", "date", "lemon", "mango", "grape", "peach", "melon")
SYSTEM = "You are a shop assistant. Call lookup for prices."
TOOLS = [{"type": "function", "function": {
    "name": "lookup", "description": "The price of an item.",
    "parameters": {"type": "object", "properties": {"item": {"type": "string"}}, "required": ["item"]}}}]


def question(item: str) -> str:
    return f"What is the price of {item}? Answer with \\boxed{{}}."


def tool_call(item: str) -> str:
    """The assistant's tool call, exactly as Qwen's template writes one."""
    return '<tool_call>\n{"name": "lookup", "arguments": ' + json.dumps({"item": item}) + "}\n</tool_call>"


def answer(price: str) -> str:
    return f"The price is \\boxed{{{price}}}."


def guess(price: str) -> str:
    """A demonstration's answer without the tool (a guess)."""
    return f"I guess \\boxed{{{price}}}."


def make_row(rng: random.Random) -> dict[str, Any]:
    prices = {item: str(rng.randint(1, 9)) for item in ITEMS}
    item = rng.choice(ITEMS)
    return {"prompt": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question(item)}],
            "tools": TOOLS, "metadata": {"prices": prices, "item": item}, "label": prices[item]}


def make_rows(n: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    return [make_row(rng) for _ in range(n)]


def tokenizer_corpus(seed: int = 0, n: int = 400) -> list[str]:
    """The task's text with ChatML role names, the tool schema and the tool tags' contents."""
    rng = random.Random(seed)
    schema = ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided "
              "with function signatures within <tools></tools> XML tags:\nFor each function call, return a json "
              'object with function name and arguments within <tool_call></tool_call> XML tags:\n{"name": '
              '<function-name>, "arguments": <args-json-object>}')
    texts = n // 4 * [json.dumps(TOOLS[0]), "system\n" + SYSTEM, schema]
    for _ in range(n):
        item, price = rng.choice(ITEMS), str(rng.randint(1, 9))
        texts += [f"user\n{question(item)}\nassistant\n", tool_call(item), f"user\n\n{item}: {price}\n",
                  answer(price), guess(price)]
    return texts
