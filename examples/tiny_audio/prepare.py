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

import os
from dataclasses import dataclass
from typing import Any

from examples.tiny_audio import task
from examples.media_sft import Task, parse_args, prepare

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


def build(tokenizer: Any, model_dir: str, settings: PrepareSettings) -> None:
    from relax.utils.tiny_multimodal import build_tiny_omni

    build_tiny_omni(tokenizer, model_dir, hidden_size=settings.hidden_size, num_layers=settings.num_layers,
                    encoder_hidden=settings.encoder_hidden, encoder_depth=settings.encoder_depth, seed=settings.seed)


TASK = Task(subdir=MODEL_SUBDIR, modality="audio", answers=("1", "2"), make_rows=task.make_rows,
            response_text=task.response_text, tokenizer_corpus=task.tokenizer_corpus, build=build)


def main(argv: list[str] | None = None) -> None:
    out_dir, settings, force = parse_args(__doc__, PrepareSettings, argv)
    summary = prepare(out_dir, settings, TASK, force=force)
    verb = "already prepared (same settings; --force to redo)" if summary["skipped"] else "prepared"
    print(f"tiny_audio {verb}: {out_dir}")
    print(f"  model: {summary['params']:,} params (qwen3_omni_moe_thinker), {out_dir}/{MODEL_SUBDIR}/")
    print(f"  SFT: {summary['sft_steps_run']} steps, final loss {summary['sft_final_loss']:.3f}, "
          f"held-out expected accuracy {summary['eval_expected_accuracy']:.3f} (chance 0.5)")


if __name__ == "__main__":
    main()
