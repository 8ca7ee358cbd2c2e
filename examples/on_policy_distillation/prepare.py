"""Prepare the CPU on-policy distillation example: a stronger teacher and a weak student.

    python -m examples.on_policy_distillation.prepare --out-dir DIR [--seed 1234] [--force]

Both models are tiny Qwen3s on the tiny_math task (examples/tiny_math), built by the same
`prepare` with the same seed, so they share the tokenizer and the data (OPD scores the
student's tokens with the teacher token for token):

    DIR/teacher/models/tiny-qwen3-sft/   hidden 256, 4 layers (~4.3 M params), 250 SFT steps (accuracy ~1.0)
    DIR/student/models/tiny-qwen3-sft/   hidden 64, 2 layers (~0.15 M params), SFT stopped early (weak)
    DIR/student/data/{train,eval}.jsonl  the task rows

Running it again with the same settings does nothing (`--force` redoes it).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os

from examples.tiny_math.prepare import MODEL_SUBDIR, PrepareSettings, prepare


def teacher_settings(seed: int) -> PrepareSettings:
    # No early stop: the teacher trains for all its steps and ends well above the student.
    return PrepareSettings(seed=seed, hidden_size=256, num_layers=4, sft_steps=250, sft_stop_at=0.0)


def student_settings(seed: int) -> PrepareSettings:
    # The quickstart's weak warm start (stops once sampled accuracy reaches 0.2), smaller model.
    return PrepareSettings(seed=seed, hidden_size=64, num_layers=2)


def same_tokenizer(a: str, b: str) -> bool:
    def vocab(path: str) -> dict:
        with open(os.path.join(path, "tokenizer.json"), encoding="utf-8") as f:
            return json.load(f)["model"]["vocab"]
    return vocab(a) == vocab(b)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out-dir", required=True)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--force", action="store_true")
    args = parser.parse_args(argv)
    summaries = {}
    for name, settings in (("teacher", teacher_settings(args.seed)), ("student", student_settings(args.seed))):
        summary = prepare(os.path.join(args.out_dir, name), settings, force=args.force)
        summaries[name] = summary
        print(f"{name}: {summary['params']:,} params, {summary['sft_steps_run']} SFT steps, held-out accuracy "
              f"sampled(T=1) {summary['eval_sampled_t1']['accuracy']:.3f} "
              f"greedy {summary['eval_greedy']['accuracy']:.3f}"
              f"{' (already prepared)' if summary['skipped'] else ''}")
    teacher, student = (os.path.join(args.out_dir, n, MODEL_SUBDIR) for n in ("teacher", "student"))
    if not same_tokenizer(teacher, student):
        raise SystemExit(f"teacher and student tokenizers differ ({teacher} vs {student}); OPD needs one tokenizer")
    with open(os.path.join(args.out_dir, "opd_prepare.json"), "w", encoding="utf-8") as f:
        json.dump({n: {"settings": dataclasses.asdict(s), "accuracy_t1": summaries[n]["eval_sampled_t1"]["accuracy"]}
                   for n, s in (("teacher", teacher_settings(args.seed)), ("student", student_settings(args.seed)))},
                  f, indent=2)


if __name__ == "__main__":
    main()
