"""Prepare the CPU vision example: data, a tiny Qwen2.5-VL and its SFT warm start.

    python -m examples.tiny_vision.prepare --out-dir DIR [--seed 1234] [--kind qwen3_vl] [--force] [--plan-only]

writes

    DIR/data/train.jsonl, DIR/data/eval.jsonl        Relax rows (prompt, inline PNG image, label)
    DIR/models/tiny-vl-sft/                           HF checkpoint (safetensors, tokenizer, image processor)
    DIR/models/tiny-vl-sft/prepare.json               settings, SFT losses, accuracy, timings

`--plan-only` (for a `--dry-run` of a script over this model) writes PLAN_ROWS rows of each split
and only the model's config.json, under DIR/models/tiny-vl-plan/, in seconds: what a dry run reads,
with no weights and no SFT.

The warm start is deliberately weak: its targets are right only `--sft-correct-frac` of the time
(else another cell, at random), so the model learns to see the red cell but stays unsure, and
SFT stops once its expected accuracy (the mean probability of the exact correct response,
teacher-forced: what T=1 sampling scores) reaches `--sft-stop-at`. RL then has room to learn:
it sharpens an unsure policy whose uncertainty is visible to the reward. The model sees the
images through its own (random-initialised) vision tower, trained end to end.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any

from examples.tiny_vision import task
from examples.media_sft import TOKENIZER_VOCAB, Task, parse_args, prepare, write_jsonl

MODEL_SUBDIR = os.path.join("models", "tiny-vl-sft")
PLAN_SUBDIR = os.path.join("models", "tiny-vl-plan")  # --plan-only: config.json alone
PLAN_ROWS = 64  # --plan-only rows per split (thousands of inline PNGs take seconds to encode)


@dataclass(frozen=True)
class PrepareSettings:
    seed: int = 1234
    kind: str = "qwen2_5_vl"
    sft_steps: int = 800
    sft_stop_at: float = 0.4
    sft_correct_frac: float = 0.5
    sft_check_every: int = 10
    sft_lr: float = 3e-3
    sft_batch_size: int = 32
    n_train: int = 4000
    n_eval: int = 256
    hidden_size: int = 64
    num_layers: int = 2
    vision_hidden: int = 64
    vision_depth: int = 2


def build(tokenizer: Any, model_dir: str, settings: PrepareSettings) -> None:
    from relax.utils.tiny_multimodal import build_tiny_vl

    build_tiny_vl(settings.kind, tokenizer, model_dir, hidden_size=settings.hidden_size,
                  num_layers=settings.num_layers, vision_hidden=settings.vision_hidden,
                  vision_depth=settings.vision_depth, seed=settings.seed)


TASK = Task(subdir=MODEL_SUBDIR, modality="image", answers=("1", "2", "3", "4"), make_rows=task.make_rows,
            response_text=task.response_text, tokenizer_corpus=task.tokenizer_corpus, build=build)


def prepare_plan_only(out_dir: str, settings: PrepareSettings) -> str:
    """A sample of the task's rows and the model's config.json (its tokenizer trained for the vocabulary
    and media token ids; no weights, no SFT): what `relax-train --dry-run` reads. Returns the model directory."""
    from relax.utils.tiny_model import train_chatml_tokenizer
    from relax.utils.tiny_multimodal import tiny_vl_config

    write_jsonl(os.path.join(out_dir, "data", "train.jsonl"), task.make_rows(PLAN_ROWS, settings.seed))
    write_jsonl(os.path.join(out_dir, "data", "eval.jsonl"), task.make_rows(PLAN_ROWS, settings.seed + 1))
    tokenizer = train_chatml_tokenizer(task.tokenizer_corpus(), vocab_size=TOKENIZER_VOCAB)
    config = tiny_vl_config(settings.kind, tokenizer, hidden_size=settings.hidden_size,
                            num_layers=settings.num_layers, vision_hidden=settings.vision_hidden,
                            vision_depth=settings.vision_depth)
    model_dir = os.path.join(out_dir, PLAN_SUBDIR)
    config.save_pretrained(model_dir)
    return model_dir


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    plan_only = "--plan-only" in argv
    out_dir, settings, force = parse_args(__doc__, PrepareSettings, [a for a in argv if a != "--plan-only"])
    if plan_only:
        print(f"tiny_vision plan-only (rows and config.json, no weights): {prepare_plan_only(out_dir, settings)}")
        return
    summary = prepare(out_dir, settings, TASK, force=force)
    verb = "already prepared (same settings; --force to redo)" if summary["skipped"] else "prepared"
    print(f"tiny_vision {verb}: {out_dir}")
    print(f"  model: {summary['params']:,} params ({settings.kind}), {out_dir}/{MODEL_SUBDIR}/")
    print(f"  SFT: {summary['sft_steps_run']} steps, final loss {summary['sft_final_loss']:.3f}, "
          f"held-out expected accuracy {summary['eval_expected_accuracy']:.3f} (chance 0.25)")


if __name__ == "__main__":
    main()
