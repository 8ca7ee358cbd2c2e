"""Tiny Qwen3 models and ChatML tokenizers built from scratch, for CPU runs and tests.

There is no model hub on CI machines or laptops without network, so the CPU quickstart and
the integration tests build their model locally: a byte-level BPE tokenizer trained on the
task's own text (digits split one per token, Qwen's ChatML special tokens and chat
template) and a randomly initialised `Qwen3ForCausalLM` small enough to train in seconds.
`save_tiny_model` writes an ordinary HF checkpoint (safetensors + generation_config), so
every backend loads it exactly as it would load a real Qwen3 checkpoint.

torch / transformers / tokenizers are imported inside the functions so that importing
`relax.utils` stays cheap.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Iterable

if TYPE_CHECKING:  # pragma: no cover - typing only
    from transformers import PreTrainedTokenizerFast, Qwen3ForCausalLM, Qwen3MoeForCausalLM

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (PAD_TOKEN, IM_START, IM_END)

# Qwen-style ChatML: every message is `<|im_start|>{role}\n{content}<|im_end|>\n`; the
# generation prompt opens an assistant turn. A system message is just the first message.
CHATML_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)


# Qwen2.5's chat template, as its tokenizer_config.json ships it: tools listed in the system turn,
# assistant tool calls as `<tool_call>\n{"name": ..., "arguments": ...}\n</tool_call>`, and tool results
# (role "tool") as `<tool_response>` blocks inside a user turn. The agentic examples and tests use it
# (`train_chatml_tokenizer(..., tool_template=True)`), with the tool tags as added (not special) tokens,
# as in Qwen's vocabulary.
QWEN_TOOL_TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}{%- if messages[0]['role'] == 'system' %}"
    "{{- messages[0]['content'] }}{%- else %}"
    "{{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}{%- endif %}"
    "{{- \"\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>\" }}"
    "{%- for tool in tools %}{{- \"\\n\" }}{{- tool | tojson }}{%- endfor %}"
    "{{- \"\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\\"name\\\": <function-name>, "
    "\\\"arguments\\\": <args-json-object>}\\n</tool_call><|im_end|>\\n\" }}"
    "{%- else %}{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}{%- else %}"
    "{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if (message.role == \"user\") or (message.role == \"system\" and not loop.first) or "
    "(message.role == \"assistant\" and not message.tool_calls) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- elif message.role == \"assistant\" %}{{- '<|im_start|>' + message.role }}"
    "{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}"
    "{%- for tool_call in message.tool_calls %}{%- if tool_call.function is defined %}"
    "{%- set tool_call = tool_call.function %}{%- endif %}"
    "{{- '\\n<tool_call>\\n{\"name\": \"' }}{{- tool_call.name }}{{- '\", \"arguments\": ' }}"
    "{{- tool_call.arguments | tojson }}{{- '}\\n</tool_call>' }}{%- endfor %}{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == \"tool\" %}"
    "{%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != \"tool\") %}{{- '<|im_start|>user' }}"
    "{%- endif %}{{- '\\n<tool_response>\\n' }}{{- message.content }}{{- '\\n</tool_response>' }}"
    "{%- if loop.last or (messages[loop.index0 + 1].role != \"tool\") %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
TOOL_TAGS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")


def train_chatml_tokenizer(texts: Iterable[str], *, vocab_size: int = 512,
                           tool_template: bool = False) -> "PreTrainedTokenizerFast":
    """Train a byte-level BPE tokenizer with ChatML special tokens on `texts`.

    Digits are always split into single-digit tokens (as Qwen does), so numbers never merge
    into opaque multi-digit tokens. Any byte string round-trips through encode/decode because
    the 256 byte symbols are in the initial alphabet. `vocab_size` must leave room for them.
    `tool_template`: Qwen2.5's chat template with tool calls (`QWEN_TOOL_TEMPLATE`) and the tool
    tags as added tokens, instead of the plain ChatML template.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    min_size = 256 + len(SPECIAL_TOKENS)
    if vocab_size < min_size:
        raise ValueError(f"vocab_size={vocab_size} is too small: a byte-level BPE needs at least {min_size}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(texts), trainer=trainer)
    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=PAD_TOKEN,
        additional_special_tokens=[IM_START],
        clean_up_tokenization_spaces=False,
        model_max_length=256,
    )
    hf_tok.chat_template = QWEN_TOOL_TEMPLATE if tool_template else CHATML_TEMPLATE
    if tool_template:
        hf_tok.add_tokens(list(TOOL_TAGS))
    return hf_tok


def build_tiny_qwen3(
    tokenizer: "PreTrainedTokenizerFast",
    *,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int | None = None,
    intermediate_size: int | None = None,
    max_position_embeddings: int = 256,
    seed: int = 0,
) -> "Qwen3ForCausalLM":
    """A randomly initialised Qwen3ForCausalLM sized for CPU (defaults: ~0.1 M params).

    Embeddings are tied; pad/eos ids come from `tokenizer`. The same `seed` gives the same
    weights on every machine (torch's CPU generator is deterministic).
    """
    from transformers import Qwen3Config, Qwen3ForCausalLM

    if hidden_size % num_heads:
        raise ValueError(f"hidden_size={hidden_size} must be divisible by num_heads={num_heads}")
    num_kv_heads = num_kv_heads or num_heads
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads={num_heads} must be divisible by num_kv_heads={num_kv_heads}")
    config = Qwen3Config(
        **_qwen3_shape(tokenizer, hidden_size=hidden_size, num_layers=num_layers, num_heads=num_heads,
                       num_kv_heads=num_kv_heads, intermediate_size=intermediate_size or 4 * hidden_size,
                       max_position_embeddings=max_position_embeddings),
        max_window_layers=num_layers,
    )
    return _seeded_model(Qwen3ForCausalLM, config, tokenizer, seed)


def _qwen3_shape(tokenizer: Any, *, hidden_size: int, num_layers: int, num_heads: int, num_kv_heads: int,
                 intermediate_size: int, max_position_embeddings: int) -> dict[str, Any]:
    """The config fields the dense and the MoE tiny model set alike: the sizes (head_dim from the
    heads), tied embeddings, the KV cache on, and the tokenizer's vocabulary, pad and eos ids (no bos)."""
    return {
        "vocab_size": len(tokenizer), "hidden_size": hidden_size, "intermediate_size": intermediate_size,
        "num_hidden_layers": num_layers, "num_attention_heads": num_heads, "num_key_value_heads": num_kv_heads,
        "head_dim": hidden_size // num_heads, "max_position_embeddings": max_position_embeddings,
        "tie_word_embeddings": True, "pad_token_id": tokenizer.pad_token_id,
        "eos_token_id": tokenizer.eos_token_id, "bos_token_id": None, "use_cache": True,
    }


def _seeded_model(model_class: Any, config: Any, tokenizer: Any, seed: int) -> Any:
    """`model_class(config)` initialised from `seed` (the global RNG left as it was), generating
    with the tokenizer's pad and eos ids and no bos."""
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_class(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.bos_token_id = None
    return model


def build_tiny_qwen3_moe(
    tokenizer: "PreTrainedTokenizerFast",
    *,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_experts: int = 8,
    top_k: int = 2,
    init_std: float = 0.1,
    max_position_embeddings: int = 256,
    seed: int = 0,
) -> "Qwen3MoeForCausalLM":
    """A randomly initialised Qwen3MoeForCausalLM for CPU (routing replay, docs/moe.md): every
    layer MoE with normalised top-k gating (Qwen3-30B-A3B's layout, which megatron converts too).

    `init_std` 0.1 (Qwen3's own is 0.02): with weights that small a random model's experts add
    almost nothing to the residual stream and which experts a token takes barely moves its
    log-probs; at 0.1 routing matters as in a trained model, so a routing flip shows.
    """
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    config = Qwen3MoeConfig(
        **_qwen3_shape(tokenizer, hidden_size=hidden_size, num_layers=num_layers, num_heads=num_heads,
                       num_kv_heads=num_heads, intermediate_size=4 * hidden_size,
                       max_position_embeddings=max_position_embeddings),
        moe_intermediate_size=hidden_size, num_experts=num_experts, num_experts_per_tok=top_k,
        norm_topk_prob=True, initializer_range=init_std,
    )
    return _seeded_model(Qwen3MoeForCausalLM, config, tokenizer, seed)


def save_tiny_model(model: "Qwen3ForCausalLM", tokenizer: "PreTrainedTokenizerFast", out_dir: str) -> str:
    """Write `model` + `tokenizer` as an HF checkpoint (safetensors, generation_config with eos)."""
    os.makedirs(out_dir, exist_ok=True)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def count_parameters(model: "Qwen3ForCausalLM") -> int:
    """Number of distinct parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in model.parameters())
