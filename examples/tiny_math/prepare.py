"""Prepare the CPU quickstart: data, tokenizer, tiny Qwen3 and its SFT warm start.

    python -m examples.tiny_math.prepare --out-dir DIR [--seed 1234] [--sft-steps N] [--force] [--plan-only]

writes

    DIR/data/train.jsonl, DIR/data/eval.jsonl        Relax rows (prompt messages + label)
    DIR/models/tiny-qwen3-sft/                        HF checkpoint (safetensors, tokenizer)
    DIR/models/tiny-qwen3-sft/prepare.json            settings, SFT loss, eval, timings

`--plan-only` (for `run-tiny-cpu.sh --dry-run`) writes the data and only the model's config.json,
under DIR/models/tiny-qwen3-plan/, in seconds: what a dry run reads, with no tokenizer training,
no weights and no SFT.

Everything is deterministic for a given seed (single-threaded torch, seeded RNGs). When
prepare.json already records the same settings the run is skipped (use --force to redo).
See examples/tiny_math/README.md for why the warm start is deliberately weak.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

MODEL_SUBDIR = os.path.join("models", "tiny-qwen3-sft")
PLAN_SUBDIR = os.path.join("models", "tiny-qwen3-plan")  # --plan-only: config.json alone


@dataclass(frozen=True)
class PrepareSettings:
    """Everything that determines prepare's outputs (recorded in prepare.json)."""

    seed: int = 1234
    sft_steps: int = 300
    sft_stop_at: float = 0.2
    sft_check_every: int = 5
    sft_lr: float = 2e-3
    sft_batch_size: int = 64
    correct_frac: float = 1.0
    n_train: int = 20000
    n_eval: int = 256
    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    vocab_size: int = 512


def parse_args(argv: list[str] | None = None) -> tuple[str, PrepareSettings, bool, bool]:
    defaults = PrepareSettings()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out-dir", required=True, help="where data/ and models/ are written")
    parser.add_argument("--force", action="store_true", help="redo even if outputs with these settings exist")
    parser.add_argument("--plan-only", action="store_true", help="data and the model's config.json only "
                        f"(in <out-dir>/{PLAN_SUBDIR}), for a dry run")
    for name, value in asdict(defaults).items():
        parser.add_argument("--" + name.replace("_", "-"), type=type(value), default=value)
    args = vars(parser.parse_args(argv))
    out_dir, force, plan_only = args.pop("out_dir"), args.pop("force"), args.pop("plan_only")
    return out_dir, PrepareSettings(**args), force, plan_only


def prepare_plan_only(out_dir: str, settings: PrepareSettings) -> str:
    """The task data and a config.json of the model's shape (no tokenizer, no weights, no SFT): what
    `relax-train --dry-run` reads. Returns the model directory."""
    from transformers import Qwen3Config

    from examples.tiny_math.task import make_row, make_splits

    train_lists, eval_lists = make_splits(n_train=settings.n_train, n_eval=settings.n_eval, seed=settings.seed)
    write_jsonl(os.path.join(out_dir, "data", "train.jsonl"), [make_row(n) for n in train_lists])
    write_jsonl(os.path.join(out_dir, "data", "eval.jsonl"), [make_row(n) for n in eval_lists])
    h = settings.hidden_size
    config = Qwen3Config(vocab_size=settings.vocab_size, hidden_size=h, intermediate_size=4 * h,
                         num_hidden_layers=settings.num_layers, num_attention_heads=settings.num_heads,
                         num_key_value_heads=settings.num_heads, head_dim=h // settings.num_heads,
                         max_position_embeddings=256, tie_word_embeddings=True)
    model_dir = os.path.join(out_dir, PLAN_SUBDIR)
    config.save_pretrained(model_dir)
    return model_dir


def write_jsonl(path: str, rows: list[dict[str, Any]]) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def already_prepared(out_dir: str, settings: PrepareSettings) -> dict[str, Any] | None:
    """The recorded summary when every output exists with the same settings, else None."""
    record = os.path.join(out_dir, MODEL_SUBDIR, "prepare.json")
    needed = [record, os.path.join(out_dir, "data", "train.jsonl"), os.path.join(out_dir, "data", "eval.jsonl"),
              os.path.join(out_dir, MODEL_SUBDIR, "model.safetensors")]
    if not all(os.path.exists(p) for p in needed):
        return None
    with open(record, encoding="utf-8") as f:
        summary = json.load(f)
    return summary if summary.get("settings") == asdict(settings) else None


def validation_rows(settings: PrepareSettings, *, exclude: set[tuple[int, ...]]) -> list[dict[str, Any]]:
    """Rows for the SFT early-stopping check, never taken from the held-out eval set."""
    from examples.tiny_math.task import make_row, make_splits

    _, lists = make_splits(n_train=0, n_eval=settings.n_eval, seed=settings.seed + 1)
    return [make_row(n) for n in lists if n not in exclude]


def early_stop(model: Any, tokenizer: Any, rows: list[dict[str, Any]], settings: PrepareSettings,
               checks: list[dict[str, float]]) -> Callable[[int], bool]:
    """SFT callback: every `sft_check_every` steps measure sampled (T=1) accuracy on `rows`
    and stop once it reaches `sft_stop_at` (0 disables), so the warm start lands at the same
    weak-but-nonzero skill level whatever the seed. Appends each check to `checks`."""
    from examples.tiny_math.sft import evaluate

    def callback(step: int) -> bool:
        if settings.sft_stop_at <= 0 or step % settings.sft_check_every:
            return False
        result = evaluate(model, tokenizer, rows, greedy=False, temperature=1.0)
        model.train()
        checks.append({"step": step, "accuracy": result["accuracy"], "format_rate": result["format_rate"]})
        return result["accuracy"] >= settings.sft_stop_at

    return callback


def prepare(out_dir: str, settings: PrepareSettings, *, force: bool = False) -> dict[str, Any]:
    """Write data, tokenizer and the SFT-warm-started model; returns the prepare.json summary."""
    if not force and (summary := already_prepared(out_dir, settings)) is not None:
        return {**summary, "skipped": True}
    import torch

    from examples.tiny_math.sft import evaluate, sft_train
    from examples.tiny_math.task import make_row, make_splits, tokenizer_corpus
    from relax.utils.tiny_model import build_tiny_qwen3, count_parameters, save_tiny_model, train_chatml_tokenizer

    start = time.perf_counter()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # bit-for-bit repeatable and polite on a shared 2-core box
    torch.manual_seed(settings.seed)
    train_lists, eval_lists = make_splits(n_train=settings.n_train, n_eval=settings.n_eval, seed=settings.seed)
    train_rows, eval_rows = [make_row(n) for n in train_lists], [make_row(n) for n in eval_lists]
    write_jsonl(os.path.join(out_dir, "data", "train.jsonl"), train_rows)
    write_jsonl(os.path.join(out_dir, "data", "eval.jsonl"), eval_rows)

    tokenizer = train_chatml_tokenizer(tokenizer_corpus(settings.seed), vocab_size=settings.vocab_size)
    model = build_tiny_qwen3(tokenizer, hidden_size=settings.hidden_size, num_layers=settings.num_layers,
                             num_heads=settings.num_heads, seed=settings.seed)
    val_rows = validation_rows(settings, exclude=set(eval_lists))
    checks: list[dict[str, float]] = []
    stop = early_stop(model, tokenizer, val_rows, settings, checks)
    sft = sft_train(model, tokenizer, train_lists, steps=settings.sft_steps, batch_size=settings.sft_batch_size,
                    lr=settings.sft_lr, correct_frac=settings.correct_frac, seed=settings.seed, callback=stop)
    torch.manual_seed(settings.seed)
    greedy = evaluate(model, tokenizer, eval_rows, greedy=True)
    sampled = evaluate(model, tokenizer, eval_rows, greedy=False, temperature=1.0)
    model_dir = save_tiny_model(model, tokenizer, os.path.join(out_dir, MODEL_SUBDIR))
    losses = sft["losses"]
    summary = {
        "settings": asdict(settings),
        "params": count_parameters(model),
        "vocab_size": len(tokenizer),
        "n_train": len(train_rows),
        "n_eval": len(eval_rows),
        "sft_steps_run": len(losses),
        "sft_checks": checks,
        "sft_first_loss": losses[0] if losses else None,
        "sft_final_loss": sum(losses[-10:]) / max(len(losses[-10:]), 1),
        "sft_seconds": round(sft["seconds"], 2),
        "eval_greedy": greedy,
        "eval_sampled_t1": sampled,
        "total_seconds": round(time.perf_counter() - start, 2),
    }
    with open(os.path.join(model_dir, "prepare.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=2)
    torch.set_num_threads(threads)
    return {**summary, "skipped": False}


def main(argv: list[str] | None = None) -> None:
    out_dir, settings, force, plan_only = parse_args(argv)
    if plan_only:
        print(f"tiny_math plan-only (data and config.json, no weights): {prepare_plan_only(out_dir, settings)}")
        return
    summary = prepare(out_dir, settings, force=force)
    verb = "already prepared (same settings; --force to redo)" if summary["skipped"] else "prepared"
    print(f"tiny_math {verb}: {out_dir}")
    print(f"  data: {summary['n_train']} train / {summary['n_eval']} eval rows in {out_dir}/data/")
    print(f"  model: {summary['params']:,} params, vocab {summary['vocab_size']}, {out_dir}/{MODEL_SUBDIR}/")
    print(f"  SFT: {summary['sft_steps_run']} steps (max {summary['settings']['sft_steps']}), "
          f"final loss {summary['sft_final_loss']:.3f}, "
          f"{summary['sft_seconds']} s")
    print(f"  held-out accuracy after SFT: greedy {summary['eval_greedy']['accuracy']:.3f}, "
          f"sampled(T=1) {summary['eval_sampled_t1']['accuracy']:.3f}, "
          f"boxed format {summary['eval_sampled_t1']['format_rate']:.2f}")


if __name__ == "__main__":
    main()
