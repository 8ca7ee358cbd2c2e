"""Prepare the CPU vision example: data, a tiny Qwen2.5-VL and its SFT warm start.

    python -m examples.tiny_vision.prepare --out-dir DIR [--seed 1234] [--force]

writes

    DIR/data/train.jsonl, DIR/data/eval.jsonl        Relax rows (prompt, inline PNG image, label)
    DIR/models/tiny-vl-sft/                           HF checkpoint (safetensors, tokenizer, image processor)
    DIR/models/tiny-vl-sft/prepare.json               settings, SFT losses, accuracy, timings

The warm start is deliberately weak: its targets are right only `--sft-correct-frac` of the time
(else another cell, at random), so the model learns to see the red cell but stays unsure, and
SFT stops once its expected accuracy (the mean probability of the exact correct response,
teacher-forced: what T=1 sampling scores) reaches `--sft-stop-at`. RL then has room to learn:
it sharpens an unsure policy whose uncertainty is visible to the reward. The model sees the
images through its own (random-initialised) vision tower, trained end to end.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from examples.tiny_vision import task
from examples.media_sft import Task, parse_args, prepare

MODEL_SUBDIR = os.path.join("models", "tiny-vl-sft")


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


def main(argv: list[str] | None = None) -> None:
    out_dir, settings, force = parse_args(__doc__, PrepareSettings, argv)
    summary = prepare(out_dir, settings, TASK, force=force)
    verb = "already prepared (same settings; --force to redo)" if summary["skipped"] else "prepared"
    print(f"tiny_vision {verb}: {out_dir}")
    print(f"  model: {summary['params']:,} params ({settings.kind}), {out_dir}/{MODEL_SUBDIR}/")
    print(f"  SFT: {summary['sft_steps_run']} steps, final loss {summary['sft_final_loss']:.3f}, "
          f"held-out expected accuracy {summary['eval_expected_accuracy']:.3f} (chance 0.25)")


if __name__ == "__main__":
    main()
