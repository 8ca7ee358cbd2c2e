"""The shared half of the CPU multimodal examples' preparation (examples/tiny_vision,
examples/tiny_audio): rows, a tiny checkpoint, and a deliberately weak SFT warm start.

SFT trains on the response tokens only (teacher-forced, the rows encoded exactly as the rollout
encodes them) and stops once the expected accuracy — the mean probability of the exact correct
response, what T=1 sampling scores — reaches `settings.sft_stop_at`, checked every
`settings.sft_check_every` steps; `settings.sft_correct_frac` < 1 makes the targets noisy instead.
Each example supplies a `Task` (its rows, answers, modality and model builder) and its settings
dataclass (the fields `prepare` reads: seed, n_train, n_eval, sft_*).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable


TOKENIZER_VOCAB = 300  # the tiny tokenizer's trained vocabulary (the media tokens come on top)


@dataclass(frozen=True)
class Task:
    subdir: str                                   # the checkpoint's directory under --out-dir
    modality: str                                 # the rows' media column: "image" | "audio"
    answers: tuple[str, ...]                      # every label; a noisy target is another of them
    make_rows: Callable[[int, int], list[dict[str, Any]]]  # (n, seed) -> rows
    response_text: Callable[[str], str]           # label -> the response trained on
    tokenizer_corpus: Callable[[], list[str]]
    build: Callable[[Any, str, Any], Any]         # (tokenizer, model_dir, settings) -> writes the checkpoint


def parse_args(doc: str, settings_cls: type, argv: list[str] | None = None) -> tuple[str, Any, bool]:
    """--out-dir, --force and one flag per settings field."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--out-dir", required=True, help="where data/ and models/ are written")
    parser.add_argument("--force", action="store_true", help="redo even if outputs with these settings exist")
    for name, value in asdict(settings_cls()).items():
        parser.add_argument("--" + name.replace("_", "-"), type=type(value), default=value)
    args = vars(parser.parse_args(argv))
    out_dir, force = args.pop("out_dir"), args.pop("force")
    return out_dir, settings_cls(**args), force


def write_jsonl(path: str, rows: list[dict[str, Any]]) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def encode_rows(processor: Any, rows: list[dict[str, Any]], task: Task, *, correct_frac: float = 1.0,
                seed: int = 0) -> list[tuple[list[int], list[int], dict]]:
    """(prompt ids, response ids + eos, encoder tensors) per row, as the rollout encodes them; the
    response is the right answer with probability `correct_frac`, else a wrong one."""
    from relax.utils.data.formatting import render_chat_template

    tok = processor.tokenizer
    rng = random.Random(seed)
    out = []
    for row in rows:
        enc = processor.encode(render_chat_template(row["prompt"], tok, tools=None, kwargs={}),
                               {task.modality: row[task.modality]})
        label = row["label"] if rng.random() < correct_frac else \
            rng.choice([a for a in task.answers if a != row["label"]])
        response = tok.encode(task.response_text(label), add_special_tokens=False) + [tok.eos_token_id]
        out.append((enc.input_ids, response, enc.tensors))
    return out


def response_logp(model: Any, batch: list[tuple[list[int], list[int], dict]], pad_id: int) -> Any:
    """Summed log-prob of each row's response (teacher-forced) -> [B]."""
    import torch

    from relax.utils.multimodal.models import rope_positions
    from relax.utils.multimodal.tensors import collate

    width = max(len(p) + len(r) for p, r, _ in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    target = torch.zeros_like(ids, dtype=torch.bool)
    for b, (p, r, _) in enumerate(batch):
        ids[b, :len(p) + len(r)] = torch.tensor(p + r)
        mask[b, :len(p) + len(r)] = 1
        target[b, len(p):len(p) + len(r)] = True
    tensors = collate([t for _, _, t in batch])
    logits = model(input_ids=ids, attention_mask=mask, position_ids=rope_positions(model, ids, mask, tensors),
                   **tensors).logits
    logp = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, ids[:, 1:, None])[..., 0]
    return (logp * target[:, 1:]).sum(-1)


def expected_accuracy(model: Any, encoded: list, pad_id: int) -> float:
    import torch

    with torch.no_grad():
        return float(torch.cat([response_logp(model, encoded[i:i + 64], pad_id).exp()
                                for i in range(0, len(encoded), 64)]).mean())


def cached_summary(record: str, out_dir: str, settings: Any) -> dict[str, Any] | None:
    """prepare.json's summary (marked skipped) when it records these `settings` and the data is
    there: a preparation to skip. None: prepare."""
    if not (os.path.exists(record) and os.path.exists(os.path.join(out_dir, "data", "eval.jsonl"))):
        return None
    with open(record, encoding="utf-8") as f:
        summary = json.load(f)
    return {**summary, "skipped": True} if summary.get("settings") == asdict(settings) else None


def prepare(out_dir: str, settings: Any, task: Task, *, force: bool = False) -> dict[str, Any]:
    """Write the rows, build the model (`task.build`) and warm-start it; returns prepare.json's summary
    (skipped when the outputs exist with the same settings, unless `force`)."""
    record = os.path.join(out_dir, task.subdir, "prepare.json")
    cached = None if force else cached_summary(record, out_dir, settings)
    if cached is not None:
        return cached
    import torch

    from relax.utils.multimodal.models import load_model
    from relax.utils.multimodal.processor import MultimodalProcessor
    from relax.utils.tiny_model import train_chatml_tokenizer

    start = time.perf_counter()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    train_rows = task.make_rows(settings.n_train, settings.seed)
    eval_rows = task.make_rows(settings.n_eval, settings.seed + 1)
    val_rows = task.make_rows(128, settings.seed + 2)
    write_jsonl(os.path.join(out_dir, "data", "train.jsonl"), train_rows)
    write_jsonl(os.path.join(out_dir, "data", "eval.jsonl"), eval_rows)

    model_dir = os.path.join(out_dir, task.subdir)
    task.build(train_chatml_tokenizer(task.tokenizer_corpus(), vocab_size=TOKENIZER_VOCAB), model_dir, settings)
    processor = MultimodalProcessor(model_dir)
    model = load_model(model_dir, dtype=torch.float32)
    pad = processor.tokenizer.pad_token_id
    train_enc = encode_rows(processor, train_rows, task, correct_frac=settings.sft_correct_frac, seed=settings.seed)
    val_enc = encode_rows(processor, val_rows, task)

    losses, checks = sft(model, train_enc, val_enc, pad, settings)
    model.eval()
    eval_acc = expected_accuracy(model, encode_rows(processor, eval_rows, task), pad)
    model.save_pretrained(model_dir)
    summary = {"settings": asdict(settings), "params": sum(p.numel() for p in model.parameters()),
               "sft_steps_run": len(losses), "sft_checks": checks, "sft_final_loss": losses[-1],
               "eval_expected_accuracy": eval_acc, "total_seconds": round(time.perf_counter() - start, 1)}
    with open(record, "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=2)
    torch.set_num_threads(threads)
    return {**summary, "skipped": False}


def sft(model: Any, train_enc: list[Any], val_enc: list[Any], pad: int, settings: Any
        ) -> tuple[list[float], list[dict[str, Any]]]:
    """The warm start: AdamW on the demonstrations' response tokens for `sft_steps`, stopping early
    once the validation rows' expected accuracy (checked every `sft_check_every` steps) reaches
    `sft_stop_at`. Returns the losses and the checks."""
    import torch

    rng = random.Random(settings.seed)
    torch.manual_seed(settings.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=settings.sft_lr, weight_decay=0.0)
    losses, checks = [], []
    model.train()
    for step in range(1, settings.sft_steps + 1):
        batch = [rng.choice(train_enc) for _ in range(settings.sft_batch_size)]
        loss = -response_logp(model, batch, pad).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
        if step % settings.sft_check_every == 0:
            model.eval()
            acc = expected_accuracy(model, val_enc, pad)
            model.train()
            checks.append({"step": step, "expected_accuracy": acc})
            if acc >= settings.sft_stop_at:
                break
    return losses, checks
