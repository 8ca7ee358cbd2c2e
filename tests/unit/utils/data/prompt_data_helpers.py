"""Helpers for prompt-data tests: a tiny ChatML tokenizer saved to disk and row writers."""

from __future__ import annotations

import json
from pathlib import Path

CHATML_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nTOOLS {{ tools | tojson }}<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think></think>\n{% endif %}{% endif %}"
)
WORDS = "what is one two three plus minus times the answer question user assistant system be brief".split()


def build_tiny_tokenizer(save_dir: Path):
    """A word-level tokenizer with a ChatML template, saved so `AutoTokenizer.from_pretrained` loads it."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.WordLevelTrainer(special_tokens=["[UNK]", "<|im_start|>", "<|im_end|>"])
    backend.train_from_iterator([" ".join(WORDS)], trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", eos_token="<|im_end|>",
                                        additional_special_tokens=["<|im_start|>"])
    tokenizer.chat_template = CHATML_TEMPLATE
    tokenizer.save_pretrained(str(save_dir))
    return AutoTokenizer.from_pretrained(str(save_dir))


def write_jsonl(path: Path, rows: list) -> Path:
    """Rows may be dicts (dumped as JSON) or raw strings (written verbatim, for malformed lines)."""
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


def write_parquet(path: Path, rows: list[dict]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), str(path))
    return path


def numbered_rows(count: int) -> list[dict]:
    return [{"input": f"question {i}", "label": str(i), "metadata": {"id": i}} for i in range(count)]
