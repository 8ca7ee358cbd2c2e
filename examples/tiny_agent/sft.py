"""Multi-turn SFT warm start for the agentic examples (tiny_agent: text, deepeyes: images).

A demonstration is the token sequence the multi-turn rollout itself would build, segment by
segment: the chat-templated prompt, each assistant turn (+ <|im_end|>), each observation through
`relax.engine.agentic.observation.ObservationEncoder` (the template's own delimiters; images
expanded by the model's processor). Only assistant tokens are trained on (cross-entropy, mean over
the batch's trained tokens); prompt and observation tokens are context, as the loss mask makes
them in RL. A VL demonstration carries its images' encoder tensors (prompt image, then each
observation's), and the forward gets their M-RoPE positions.

The examples mix two kinds of demonstrations: the tool path (call the tool, read the observation,
answer) and a direct answer (a guess). Two phases: first only the tool path (`tool_steps`), where
reading the observation's answer is learned (copying a digit from a tool response emerges after
~75-100 steps; in a 30% mix it took ~400 steps and sometimes never came within 450), then the mix
with the tool path in `tool_frac` of the demonstrations (`steps`), which sets how often the
warm-started policy calls the tool (~tool_frac) and keeps the skill. RL then has to discover that
calling the tool pays.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence


@dataclass
class Demo:
    ids: list[int]
    trained: list[bool]  # per token: an assistant token (trained on)
    tensors: dict[str, Any] | None = None  # a VL demo's encoder tensors, in image order


def build_demo(segments: Sequence[tuple[list[int], bool]], tensors: dict[str, Any] | None = None) -> Demo:
    """(ids, trained) segments -> one demonstration."""
    ids, trained = [], []
    for seg_ids, train in segments:
        ids += seg_ids
        trained += [train] * len(seg_ids)
    return Demo(ids, trained, tensors)


def assistant_ids(tokenizer: Any, text: str) -> list[int]:
    """An assistant turn's ids: its text and <|im_end|> (the model closes its own turn)."""
    return tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]


def batch_loss(model: Any, demos: Sequence[Demo], pad_id: int) -> Any:
    """Cross-entropy over the trained tokens of a right-padded batch."""
    import torch

    from relax.utils.multimodal.models import rope_positions
    from relax.utils.multimodal.tensors import collate

    width = max(len(d.ids) for d in demos)
    ids_BT = torch.full((len(demos), width), pad_id, dtype=torch.long)
    mask_BT = torch.zeros_like(ids_BT)
    labels_BT = torch.full_like(ids_BT, -100)
    for b, d in enumerate(demos):
        n = len(d.ids)
        ids_BT[b, :n], mask_BT[b, :n] = torch.tensor(d.ids), 1
        labels_BT[b, :n] = torch.tensor([t if train else -100 for t, train in zip(d.ids, d.trained)])
    extra: dict[str, Any] = {}
    if any(d.tensors for d in demos):
        extra = collate([d.tensors for d in demos])
        extra["position_ids"] = rope_positions(model, ids_BT, mask_BT, extra)
    logits_BTV = model(input_ids=ids_BT, attention_mask=mask_BT, **extra).logits
    return torch.nn.functional.cross_entropy(logits_BTV[:, :-1].reshape(-1, logits_BTV.shape[-1]).float(),
                                             labels_BT[:, 1:].reshape(-1), ignore_index=-100)


def sft(model: Any, make_demo: Callable[[random.Random, bool], Demo], *, tool_steps: int, steps: int,
        batch_size: int, lr: float, pad_id: int, seed: int) -> dict[str, Any]:
    """`tool_steps` + `steps` AdamW steps (20-step warmup, grad clip 1.0) on fresh demonstrations,
    `make_demo(rng, tool_only)`: only the tool path in the first phase (module doc); losses and time."""
    import torch

    rng = random.Random(seed)
    torch.manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 20))
    model.train()
    losses, start = [], time.perf_counter()
    for step in range(tool_steps + steps):
        loss = batch_loss(model, [make_demo(rng, step < tool_steps) for _ in range(batch_size)], pad_id)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
    model.eval()
    return {"losses": losses, "seconds": time.perf_counter() - start}
