"""Prepare the CPU vision tool-use example (a tiny DeepEyes): data, a tiny Qwen2.5-VL whose processor
shows every image at 4 vision tokens, and its multi-turn SFT warm start.

    python -m examples.deepeyes.prepare --out-dir DIR [--seed 1234] [--tool-frac 0.3] [--force]

writes

    DIR/data/train.jsonl, DIR/data/eval.jsonl   Relax rows (system + user messages, inline PNG image,
                                                metadata with the asked region, label)
    DIR/models/tiny-deepeyes-sft/               HF checkpoint (safetensors, tokenizer, image processor)
    DIR/models/tiny-deepeyes-sft/prepare.json   settings, SFT losses, timings

The demonstrations are the rollout's own sequences (examples/tiny_agent/sft.py), the zoomed image's
tokens and tensors included: zoom-then-answer only first, then a mix with zoom in `tool_frac` of them
and a guess in the rest.
"""

from __future__ import annotations

import json
import os
import random
import time
from dataclasses import asdict, dataclass
from typing import Any

from examples.deepeyes import task
from examples.media_sft import cached_summary, parse_args, write_jsonl
from examples.tiny_agent.sft import Demo, assistant_ids, build_demo, sft

MODEL_SUBDIR = os.path.join("models", "tiny-deepeyes-sft")


@dataclass(frozen=True)
class PrepareSettings:
    seed: int = 1234
    tool_frac: float = 0.3
    sft_tool_steps: int = 300  # SFT phase 1: zoom demonstrations only (reading the crop is learned by ~50 steps,
    #                            copying the asked region into the call by ~250)
    sft_steps: int = 100  # phase 2: the mix (zoom in tool_frac of the demonstrations)
    sft_lr: float = 3e-3
    sft_batch_size: int = 32
    n_train: int = 2000
    n_eval: int = 256
    hidden_size: int = 128  # 64 wide / 2 layers never learned to copy the region name (300 steps)
    num_layers: int = 4
    vision_hidden: int = 64
    vision_depth: int = 2
    vocab_size: int = 512


def demo(processor: Any, observations: Any, row: dict[str, Any], rng: random.Random,
         settings: PrepareSettings, tool_only: bool = False) -> Demo:
    """Zoom + answer, or a guess, encoded as the rollout encodes them (images through the processor)."""
    from relax.utils.data.formatting import render_chat_template
    from relax.utils.multimodal.tensors import collate

    tok = processor.tokenizer
    prompt = processor.encode(render_chat_template(row["prompt"], tok, tools=None, kwargs={}), {"image": row["image"]})
    if not tool_only and rng.random() >= settings.tool_frac:
        return build_demo([(prompt.input_ids, False), (assistant_ids(tok, task.guess(str(rng.randint(1, 4)))), True)],
                          prompt.tensors)
    region = row["metadata"]["region"]
    call = assistant_ids(tok, task.tool_call(region))
    crop = task.zoom(task.from_data_uri(row["image"][0]), region)
    seen = processor.encode(observations.text("tool", "<image>", call[-1]), {"image": [crop]})
    return build_demo([(prompt.input_ids, False), (call, True), (seen.input_ids, False),
                       (assistant_ids(tok, task.answer(row["label"])), True)], collate([prompt.tensors, seen.tensors]))


def build_model(out_dir: str, settings: PrepareSettings) -> Any:
    from relax.utils.tiny_model import train_chatml_tokenizer
    from relax.utils.tiny_multimodal import build_tiny_vl

    tokenizer = train_chatml_tokenizer(task.tokenizer_corpus(), vocab_size=settings.vocab_size, tool_template=True)
    return build_tiny_vl("qwen2_5_vl", tokenizer, out_dir, hidden_size=settings.hidden_size,
                         num_layers=settings.num_layers, vision_hidden=settings.vision_hidden,
                         vision_depth=settings.vision_depth, min_tokens=4, max_tokens=4, seed=settings.seed)


def prepare(out_dir: str, settings: PrepareSettings, *, force: bool = False) -> dict[str, Any]:
    record = os.path.join(out_dir, MODEL_SUBDIR, "prepare.json")
    cached = None if force else cached_summary(record, out_dir, settings)
    if cached is not None:
        return cached
    import torch

    from relax.engine.agentic.observation import ObservationEncoder
    from relax.utils.multimodal.models import load_model
    from relax.utils.multimodal.processor import MultimodalProcessor

    start, threads = time.perf_counter(), torch.get_num_threads()
    torch.set_num_threads(1)
    rows = task.make_rows(settings.n_train, settings.seed)
    write_jsonl(os.path.join(out_dir, "data", "train.jsonl"), rows)
    write_jsonl(os.path.join(out_dir, "data", "eval.jsonl"), task.make_rows(settings.n_eval, settings.seed + 1))
    model_dir = os.path.join(out_dir, MODEL_SUBDIR)
    build_model(model_dir, settings)
    processor, model = MultimodalProcessor(model_dir), load_model(model_dir, dtype=torch.float32)
    observations = ObservationEncoder(processor.tokenizer)
    result = sft(model, lambda rng, tool_only: demo(processor, observations, rng.choice(rows), rng, settings,
                                                    tool_only),
                 tool_steps=settings.sft_tool_steps, steps=settings.sft_steps, batch_size=settings.sft_batch_size,
                 lr=settings.sft_lr,
                 pad_id=processor.tokenizer.pad_token_id, seed=settings.seed)
    model.save_pretrained(model_dir)
    summary = {"settings": asdict(settings), "params": sum(p.numel() for p in model.parameters()),
               "sft_first_loss": result["losses"][0], "sft_final_loss": sum(result["losses"][-10:]) / 10,
               "sft_seconds": round(result["seconds"], 1), "total_seconds": round(time.perf_counter() - start, 1)}
    with open(record, "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=2)
    torch.set_num_threads(threads)
    return {**summary, "skipped": False}


def main(argv: list[str] | None = None) -> None:
    out_dir, settings, force = parse_args(__doc__, PrepareSettings, argv)
    summary = prepare(out_dir, settings, force=force)
    verb = "already prepared (same settings; --force to redo)" if summary["skipped"] else "prepared"
    print(f"tiny deepeyes {verb}: {out_dir}")
    print(f"  model: {summary['params']:,} params (qwen2_5_vl), {out_dir}/{MODEL_SUBDIR}/")
    print(f"  SFT: {settings.sft_tool_steps} steps on zoom demonstrations, then {settings.sft_steps} on a mix "
          f"({settings.tool_frac:.0%} zoom), loss "
          f"{summary['sft_first_loss']:.3f} -> {summary['sft_final_loss']:.3f}, {summary['sft_seconds']} s")


if __name__ == "__main__":
    main()
