"""Prepare the CPU audio example: data, a tiny Qwen3-Omni thinker and its SFT warm start.

    python -m examples.tiny_audio.prepare --out-dir DIR [--seed 1234] [--force]

writes

    DIR/data/train.jsonl, DIR/data/eval.jsonl        Relax rows (prompt, inline WAV clip, label)
    DIR/models/tiny-omni-sft/                         HF checkpoint (safetensors, tokenizer, image processor
                                                      + WhisperFeatureExtractor)
    DIR/models/tiny-omni-sft/prepare.json             settings, SFT losses, accuracy, timings

The warm start is deliberately weak: SFT (correct targets) stops as soon as its expected accuracy
(the mean probability of the exact correct response, teacher-forced: what T=1 sampling scores)
reaches `--sft-stop-at`, checked every few steps. The tiny model first learns the answer format
(0.5, a coin flip), then starts to hear the pitch order, so the stop lands early in that rise: an
unsure policy that RL sharpens. (`--sft-correct-frac` < 1 makes the targets noisy instead, the
vision example's way to stay unsure.) The model hears the clips through its own
(random-initialised) audio encoder, trained end to end.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from dataclasses import asdict, dataclass
from typing import Any

MODEL_SUBDIR = os.path.join("models", "tiny-omni-sft")


@dataclass(frozen=True)
class PrepareSettings:
    seed: int = 1234
    sft_steps: int = 800
    sft_stop_at: float = 0.55
    sft_correct_frac: float = 1.0
    sft_check_every: int = 1
    sft_lr: float = 3e-3
    sft_batch_size: int = 32
    n_train: int = 4000
    n_eval: int = 256
    hidden_size: int = 64
    num_layers: int = 2
    encoder_hidden: int = 64
    encoder_depth: int = 2


def parse_args(argv: list[str] | None = None) -> tuple[str, PrepareSettings, bool]:
    defaults = PrepareSettings()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out-dir", required=True, help="where data/ and models/ are written")
    parser.add_argument("--force", action="store_true", help="redo even if outputs with these settings exist")
    for name, value in asdict(defaults).items():
        parser.add_argument("--" + name.replace("_", "-"), type=type(value), default=value)
    args = vars(parser.parse_args(argv))
    out_dir, force = args.pop("out_dir"), args.pop("force")
    return out_dir, PrepareSettings(**args), force


def write_jsonl(path: str, rows: list[dict[str, Any]]) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def encode_rows(processor: Any, rows: list[dict[str, Any]], *, correct_frac: float = 1.0,
                seed: int = 0) -> list[tuple[list[int], list[int], dict]]:
    """(prompt ids, response ids + eos, encoder tensors) per row, as the rollout encodes them; the
    response is the right answer with probability `correct_frac`, else the other one."""
    from examples.tiny_audio.task import response_text
    from relax.utils.data.formatting import render_chat_template

    tok = processor.tokenizer
    rng = random.Random(seed)
    out = []
    for row in rows:
        enc = processor.encode(render_chat_template(row["prompt"], tok, tools=None, kwargs={}), {"audio": row["audio"]})
        label = row["label"] if rng.random() < correct_frac else {"1": "2", "2": "1"}[row["label"]]
        response = tok.encode(response_text(label), add_special_tokens=False) + [tok.eos_token_id]
        out.append((enc.input_ids, response, enc.tensors))
    return out


def response_logp(model: Any, batch: list[tuple[list[int], list[int], dict]], pad_id: int) -> Any:
    """Summed log-prob of each row's response (teacher-forced) -> [B]."""
    import torch

    from relax.utils.multimodal.processor import collate, rope_positions

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


def prepare(out_dir: str, settings: PrepareSettings, *, force: bool = False) -> dict[str, Any]:
    record = os.path.join(out_dir, MODEL_SUBDIR, "prepare.json")
    if not force and os.path.exists(record) and os.path.exists(os.path.join(out_dir, "data", "eval.jsonl")):
        with open(record, encoding="utf-8") as f:
            summary = json.load(f)
        if summary.get("settings") == asdict(settings):
            return {**summary, "skipped": True}
    import torch

    from examples.tiny_audio.task import make_rows, tokenizer_corpus
    from relax.utils.multimodal.processor import MultimodalProcessor, load_model
    from relax.utils.tiny_model import train_chatml_tokenizer
    from relax.utils.tiny_multimodal import build_tiny_omni

    start = time.perf_counter()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    train_rows = make_rows(settings.n_train, settings.seed)
    eval_rows = make_rows(settings.n_eval, settings.seed + 1)
    val_rows = make_rows(128, settings.seed + 2)
    write_jsonl(os.path.join(out_dir, "data", "train.jsonl"), train_rows)
    write_jsonl(os.path.join(out_dir, "data", "eval.jsonl"), eval_rows)

    model_dir = os.path.join(out_dir, MODEL_SUBDIR)
    tokenizer = train_chatml_tokenizer(tokenizer_corpus(), vocab_size=300)
    build_tiny_omni(tokenizer, model_dir, hidden_size=settings.hidden_size, num_layers=settings.num_layers,
                    encoder_hidden=settings.encoder_hidden, encoder_depth=settings.encoder_depth, seed=settings.seed)
    processor = MultimodalProcessor(model_dir)
    model = load_model(model_dir, dtype=torch.float32)
    pad = processor.tokenizer.pad_token_id
    train_enc = encode_rows(processor, train_rows, correct_frac=settings.sft_correct_frac, seed=settings.seed)
    val_enc = encode_rows(processor, val_rows)

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
    model.eval()
    eval_acc = expected_accuracy(model, encode_rows(processor, eval_rows), pad)
    model.save_pretrained(model_dir)
    summary = {"settings": asdict(settings), "params": sum(p.numel() for p in model.parameters()),
               "sft_steps_run": len(losses), "sft_checks": checks, "sft_final_loss": losses[-1],
               "eval_expected_accuracy": eval_acc, "total_seconds": round(time.perf_counter() - start, 1)}
    with open(record, "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=2)
    torch.set_num_threads(threads)
    return {**summary, "skipped": False}


def main(argv: list[str] | None = None) -> None:
    out_dir, settings, force = parse_args(argv)
    summary = prepare(out_dir, settings, force=force)
    verb = "already prepared (same settings; --force to redo)" if summary["skipped"] else "prepared"
    print(f"tiny_audio {verb}: {out_dir}")
    print(f"  model: {summary['params']:,} params (qwen3_omni_moe_thinker), {out_dir}/{MODEL_SUBDIR}/")
    print(f"  SFT: {summary['sft_steps_run']} steps, final loss {summary['sft_final_loss']:.3f}, "
          f"held-out expected accuracy {summary['eval_expected_accuracy']:.3f} (chance 0.5)")


if __name__ == "__main__":
    main()
