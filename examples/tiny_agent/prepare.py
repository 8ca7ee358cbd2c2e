"""Prepare the CPU tool-use example: data, tokenizer (Qwen2.5's tool-call chat template), a tiny
Qwen3 and its multi-turn SFT warm start.

    python -m examples.tiny_agent.prepare --out-dir DIR [--seed 1234] [--tool-frac 0.2] [--force]

writes

    DIR/data/train.jsonl, DIR/data/eval.jsonl   Relax rows (system + user messages, tools, metadata
                                                with the row's price list, label)
    DIR/models/tiny-agent-sft/                  HF checkpoint (safetensors, tokenizer)
    DIR/models/tiny-agent-sft/prepare.json      settings, SFT losses, timings

Deterministic for a given seed; skipped when prepare.json records the same settings (--force redoes
it). The demonstrations are the rollout's own token sequences (examples/tiny_agent/sft.py): the tool
path only first, then a mix: the tool path in `tool_frac` of them, a guessed answer in the rest.
"""

from __future__ import annotations

import json
import os
import random
import time
from dataclasses import asdict, dataclass
from typing import Any

from examples.media_sft import cached_summary, parse_args, write_jsonl
from examples.tiny_agent import task
from examples.tiny_agent.sft import Demo, assistant_ids, build_demo, sft

MODEL_SUBDIR = os.path.join("models", "tiny-agent-sft")


@dataclass(frozen=True)
class PrepareSettings:
    seed: int = 1234
    tool_frac: float = 0.3
    tools_in_prompt: int = 0  # 1: the tools' schema in the system turn (Qwen's template; ~150 more tokens)
    sft_tool_steps: int = 100  # SFT phase 1: tool path only (reading the tool's answer is learned here)
    sft_steps: int = 100  # phase 2: the mix (tool path in tool_frac of the demonstrations)
    sft_lr: float = 2e-3
    sft_batch_size: int = 64
    n_train: int = 4000
    n_eval: int = 256
    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    vocab_size: int = 512


def prompt_ids(tokenizer: Any, row: dict[str, Any], tools_in_prompt: bool) -> list[int]:
    from relax.utils.data.formatting import render_chat_template

    text = render_chat_template(row["prompt"], tokenizer, tools=row["tools"] if tools_in_prompt else None, kwargs={})
    return tokenizer.encode(text, add_special_tokens=False)


def demo(tokenizer: Any, observations: Any, row: dict[str, Any], rng: random.Random,
         settings: PrepareSettings, tool_only: bool = False) -> Demo:
    """The tool path (call, observation, answer) or a guessed answer, as the rollout would build it."""
    prompt = prompt_ids(tokenizer, row, settings.tools_in_prompt)
    if not tool_only and rng.random() >= settings.tool_frac:
        return build_demo([(prompt, False), (assistant_ids(tokenizer, task.guess(str(rng.randint(1, 9)))), True)])
    item, price = row["metadata"]["item"], row["label"]
    call = assistant_ids(tokenizer, task.tool_call(item))
    obs, _, _ = observations.ids({"role": "tool", "content": f"{item}: {price}"}, call[-1])
    return build_demo([(prompt, False), (call, True), (obs, False), (assistant_ids(tokenizer, task.answer(price)),
                                                                      True)])


def prepare(out_dir: str, settings: PrepareSettings, *, force: bool = False) -> dict[str, Any]:
    record = os.path.join(out_dir, MODEL_SUBDIR, "prepare.json")
    cached = None if force else cached_summary(record, out_dir, settings)
    if cached is not None:
        return cached
    import torch

    from relax.engine.agentic.observation import ObservationEncoder
    from relax.utils.tiny_model import build_tiny_qwen3, save_tiny_model, train_chatml_tokenizer

    start, threads = time.perf_counter(), torch.get_num_threads()
    torch.set_num_threads(1)
    train_rows = task.make_rows(settings.n_train, settings.seed)
    eval_rows = task.make_rows(settings.n_eval, settings.seed + 1)
    if not settings.tools_in_prompt:  # the system message names the tool instead
        for row in train_rows + eval_rows:
            row.pop("tools")
    write_jsonl(os.path.join(out_dir, "data", "train.jsonl"), train_rows)
    write_jsonl(os.path.join(out_dir, "data", "eval.jsonl"), eval_rows)
    tokenizer = train_chatml_tokenizer(task.tokenizer_corpus(settings.seed), vocab_size=settings.vocab_size,
                                       tool_template=True)
    model = build_tiny_qwen3(tokenizer, hidden_size=settings.hidden_size, num_layers=settings.num_layers,
                             num_heads=settings.num_heads, max_position_embeddings=512, seed=settings.seed)
    observations = ObservationEncoder(tokenizer)
    rows = [{**row, "tools": task.TOOLS} for row in train_rows]
    result = sft(model, lambda rng, tool_only: demo(tokenizer, observations, rng.choice(rows), rng, settings,
                                                    tool_only),
                 tool_steps=settings.sft_tool_steps, steps=settings.sft_steps, batch_size=settings.sft_batch_size,
                 lr=settings.sft_lr,
                 pad_id=tokenizer.pad_token_id, seed=settings.seed)
    save_tiny_model(model, tokenizer, os.path.join(out_dir, MODEL_SUBDIR))
    summary = {"settings": asdict(settings), "params": sum(p.numel() for p in model.parameters()),
               "vocab_size": len(tokenizer), "sft_first_loss": result["losses"][0],
               "sft_final_loss": sum(result["losses"][-10:]) / 10, "sft_seconds": round(result["seconds"], 1),
               "total_seconds": round(time.perf_counter() - start, 1)}
    with open(record, "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=2)
    torch.set_num_threads(threads)
    return {**summary, "skipped": False}


def main(argv: list[str] | None = None) -> None:
    out_dir, settings, force = parse_args(__doc__, PrepareSettings, argv)
    summary = prepare(out_dir, settings, force=force)
    verb = "already prepared (same settings; --force to redo)" if summary["skipped"] else "prepared"
    print(f"tiny_agent {verb}: {out_dir}")
    print(f"  model: {summary['params']:,} params, vocab {summary['vocab_size']}, {out_dir}/{MODEL_SUBDIR}/")
    print(f"  SFT: {settings.sft_tool_steps} steps on tool demonstrations, then {settings.sft_steps} on a mix "
          f"({settings.tool_frac:.0%} call the tool), loss "
          f"{summary['sft_first_loss']:.3f} -> {summary['sft_final_loss']:.3f}, {summary['sft_seconds']} s")


if __name__ == "__main__":
    main()
