"""SFT warm start and evaluation for the tiny_math quickstart model (plain torch, CPU).

The warm start is a short, deterministic supervised run on (prompt, `format_target`)
pairs (AdamW, 20-step linear warmup, grad clip 1.0). It teaches the ChatML turn structure
and the `The largest is \\boxed{d}.` format quickly; the skill itself emerges later, so a
caller that stops early (see prepare's `early_stop`) gets a policy that is weak but not at
zero, which is what the RL stage needs to show visible learning. Loss is cross-entropy on
response tokens only (prompt tokens masked), mean over the batch's response tokens.

`evaluate` reports accuracy (the last `\\boxed{}` equals the label) and format rate (a
`\\boxed{}` is present) on held-out rows, greedy or sampled, with `model.generate`.
"""

from __future__ import annotations

import random
import time
from typing import Any, Callable, Sequence

from examples.tiny_math.task import boxed_reward, format_target, last_boxed, make_row


def prompt_ids(tokenizer: Any, row: dict[str, Any]) -> list[int]:
    """Token ids of the chat-formatted prompt (ends with `<|im_start|>assistant\\n`)."""
    text = tokenizer.apply_chat_template(row["prompt"], tokenize=False, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def response_ids(tokenizer: Any, response: str) -> list[int]:
    """Token ids of a response followed by eos (`<|im_end|>`)."""
    return tokenizer(response, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]


def sft_batch(examples: Sequence[tuple[list[int], list[int]]], pad_id: int) -> tuple[Any, Any, Any]:
    """Right-padded `input_ids_BT`, `attention_mask_BT` and `labels_BT` (-100 off the response)."""
    import torch

    width = max(len(p) + len(r) for p, r in examples)
    input_ids_BT = torch.full((len(examples), width), pad_id, dtype=torch.long)
    labels_BT = torch.full((len(examples), width), -100, dtype=torch.long)
    attention_mask_BT = torch.zeros((len(examples), width), dtype=torch.long)
    for b, (p, r) in enumerate(examples):
        n = len(p) + len(r)
        input_ids_BT[b, :n] = torch.tensor(p + r)
        labels_BT[b, len(p):n] = torch.tensor(r)
        attention_mask_BT[b, :n] = 1
    return input_ids_BT, attention_mask_BT, labels_BT


def sft_step(model: Any, optimizer: Any, examples: Sequence[tuple[list[int], list[int]]], pad_id: int) -> float:
    """One optimizer step on (prompt ids, response ids) pairs: response-token cross-entropy,
    grad clip 1.0. Returns the loss."""
    import torch

    input_ids_BT, attention_mask_BT, labels_BT = sft_batch(examples, pad_id)
    loss = model(input_ids=input_ids_BT, attention_mask=attention_mask_BT, labels=labels_BT).loss
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    return loss.item()


def sft_train(
    model: Any,
    tokenizer: Any,
    train_lists: Sequence[tuple[int, ...]],
    *,
    steps: int,
    batch_size: int = 64,
    lr: float = 2e-3,
    correct_frac: float = 1.0,
    seed: int = 0,
    callback: Callable[[int], bool] | None = None,
) -> dict[str, Any]:
    """Train `model` in place for up to `steps` AdamW steps; returns losses and wall time.

    `callback(step)` (optional) runs after each step, e.g. to evaluate along the way; when it
    returns True training stops there (early stopping).
    """
    import torch

    rng = random.Random(seed)
    torch.manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 20))
    model.train()
    losses: list[float] = []
    start = time.perf_counter()
    for _ in range(steps):
        batch = [rng.choice(train_lists) for _ in range(batch_size)]
        examples = [
            (prompt_ids(tokenizer, make_row(nums)),
             response_ids(tokenizer, format_target(nums, rng, correct_frac=correct_frac)))
            for nums in batch
        ]
        losses.append(sft_step(model, optimizer, examples, tokenizer.pad_token_id))
        schedule.step()
        if callback is not None and callback(len(losses)):
            break
    model.eval()
    return {"losses": losses, "seconds": time.perf_counter() - start}


def left_pad(prompts: Sequence[list[int]], pad_id: int) -> tuple[Any, Any]:
    """Left-padded `input_ids_BT` and `attention_mask_BT` for batched generation."""
    import torch

    width = max(len(p) for p in prompts)
    input_ids_BT = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    attention_mask_BT = torch.zeros((len(prompts), width), dtype=torch.long)
    for b, p in enumerate(prompts):
        input_ids_BT[b, width - len(p):] = torch.tensor(p)
        attention_mask_BT[b, width - len(p):] = 1
    return input_ids_BT, attention_mask_BT


def generate(
    model: Any, tokenizer: Any, prompts: Sequence[list[int]], *, greedy: bool, temperature: float = 1.0,
    max_new_tokens: int = 16,
) -> list[list[int]]:
    """Response token ids per prompt (eos kept, padding after eos dropped)."""
    import torch

    input_ids_BT, attention_mask_BT = left_pad(prompts, tokenizer.pad_token_id)
    sampling: dict[str, Any] = {"do_sample": False}
    if not greedy:
        sampling = {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
    with torch.no_grad():
        out_BT = model.generate(
            input_ids=input_ids_BT, attention_mask=attention_mask_BT, max_new_tokens=max_new_tokens,
            eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, **sampling,
        )
    responses = []
    for row in out_BT[:, input_ids_BT.shape[1]:].tolist():
        cut = row.index(tokenizer.eos_token_id) + 1 if tokenizer.eos_token_id in row else len(row)
        responses.append(row[:cut])
    return responses


def evaluate(
    model: Any, tokenizer: Any, rows: Sequence[dict[str, Any]], *, greedy: bool, temperature: float = 1.0,
    max_new_tokens: int = 16, batch_size: int = 128,
) -> dict[str, float]:
    """Accuracy and `\\boxed{}` format rate of one response per row."""
    correct = formatted = 0
    lengths = 0
    for start in range(0, len(rows), batch_size):
        chunk = rows[start:start + batch_size]
        outs = generate(model, tokenizer, [prompt_ids(tokenizer, r) for r in chunk], greedy=greedy,
                        temperature=temperature, max_new_tokens=max_new_tokens)
        for row, ids in zip(chunk, outs):
            text = tokenizer.decode(ids, skip_special_tokens=True)
            correct += boxed_reward(text, row["label"]) > 0
            formatted += last_boxed(text) is not None
            lengths += len(ids)
    n = max(len(rows), 1)
    return {"accuracy": correct / n, "format_rate": formatted / n, "mean_response_tokens": lengths / n}
