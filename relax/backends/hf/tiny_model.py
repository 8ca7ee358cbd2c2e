"""A tiny random Qwen3 checkpoint with a word-level tokenizer, built locally (no model hub).

Used by tests and CPU smoke runs: `build_tiny_qwen3(dir)` writes `config.json`, weights,
`tokenizer.json` and a ChatML chat template into `dir`, loadable with `AutoModelForCausalLM`
and `AutoTokenizer`. Token 2 (`<|im_end|>`) is the EOS; token 0 is padding.

`build_tiny_bpe_qwen3(dir)`: the same model shape over a byte-level BPE tokenizer (Qwen's kind: any
text round-trips, tokens' texts concatenate to the decoded text, Qwen2.5's tool-call template), which
constrained decoding needs (grammar.py): the word-level tokenizer joins words with spaces.
"""

from __future__ import annotations

from pathlib import Path

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<unk>"]
WORDS = ([chr(c) for c in range(ord("a"), ord("z") + 1)] + [str(d) for d in range(10)]
         + ["the", "cat", "dog", "sat", "on", "mat", "user", "assistant", "system", "is", "what",
            "answer", "plus", "minus", "yes", "no", "hello", "world", "red", "blue", "one", "two",
            "three", "four"])
CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_tiny_tokenizer():
    """A `PreTrainedTokenizerFast` over SPECIAL_TOKENS + WORDS (64 ids), whitespace pre-tokenised."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS + WORDS)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    core.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with single spaces
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", pad_token="<|endoftext|>",
                                        eos_token="<|im_end|>", additional_special_tokens=["<|im_start|>"])
    tokenizer.chat_template = CHATML_TEMPLATE
    return tokenizer


def build_tiny_qwen3(path: str | Path, *, seed: int = 0, num_hidden_layers: int = 2, hidden_size: int = 32,
                     tokenizer=None, max_position_embeddings: int = 512):
    """Write a random tiny Qwen3 (float32) and its tokenizer (default: the word-level one) to `path`;
    returns the Path."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    path = Path(path)
    tokenizer = tokenizer if tokenizer is not None else build_tiny_tokenizer()
    config = Qwen3Config(
        vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=2 * hidden_size,
        num_hidden_layers=num_hidden_layers, num_attention_heads=4, num_key_value_heads=2,
        head_dim=hidden_size // 4, max_position_embeddings=max_position_embeddings, tie_word_embeddings=False,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


BPE_CORPUS = ['{"name": "lookup", "arguments": {"item": "plum", "count": 12}}',
              "hello world, the cat sat on the mat. yes no true false null 0123456789",
              "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}\n</tool_call>",
              "alice@example.com bob@test.org [1, 2.5, -3] abc xyz"]


def build_tiny_bpe_qwen3(path: str | Path, *, seed: int = 0, hidden_size: int = 32):
    """`build_tiny_qwen3` over a byte-level BPE tokenizer of 320 ids (`relax.utils.tiny_model.
    train_chatml_tokenizer`, Qwen2.5's tool template), a 2048-token context; returns the Path."""
    from relax.utils.tiny_model import train_chatml_tokenizer

    tokenizer = train_chatml_tokenizer(BPE_CORPUS * 4, vocab_size=320, tool_template=True)
    tokenizer.model_max_length = 2048  # (the tool template's system turn alone is ~400 tokens)
    return build_tiny_qwen3(path, seed=seed, hidden_size=hidden_size, tokenizer=tokenizer,
                            max_position_embeddings=2048)
