"""Convert a megatron-backend checkpoint (`<save>/iter_N`) to an HF checkpoint directory.

    python3 scripts/tools/convert_megatron_to_hf.py --ckpt outputs/run/ckpt/iter_0000039 \
        --hf-config path/to/original/hf/model --out outputs/run/hf-step40

The checkpoint holds one file per rank (`model/tp{t}_pp{p}_ep{e}_dp{d}.pt`) and `meta.json` with the
layout; one copy of each (tensor rank, expert rank) is read; `--hf-config` is the HF model it
was trained from (its config.json and tokenizer are copied). Shards are merged and renamed by the
same functions the backend pushes weights with (`relax/backends/megatron/convert.py`): the output
loads with `AutoModelForCausalLM.from_pretrained` and in SGLang (a Qwen2.5-VL run's: its vision tower
too, written by `AutoModelForImageTextToText` with the processor files). No GPU or torch.distributed
needed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout: relax/ imports

import torch  # noqa: E402

from relax.backends.megatron.convert import (  # noqa: E402
    Layout, expert_range, global_name, hf_tensors, stage_layers, tp_merge,
)
from relax.backends.megatron.vision import VisionSide  # noqa: E402


def rank_state(ckpt: Path, t: int, stage: int, e: int, layout: tuple[int, int, int]) -> dict[str, torch.Tensor]:
    """The model state of tensor rank t, pipeline stage `stage`, expert rank e: its lowest
    data-parallel copy (expert ranks are carved out of the data-parallel ranks)."""
    pattern = f"tp{t}_pp{stage}_ep{e}_dp*.pt"
    found = sorted((ckpt / "model").glob(pattern), key=lambda p: int(p.stem.rsplit("dp", 1)[1]))
    if not found:
        tp, pp, ep = layout
        raise SystemExit(f"{ckpt}/model has no {pattern}: the checkpoint of a tp={tp} pp={pp} ep={ep} run is "
                         "incomplete")
    return torch.load(found[0], map_location="cpu", weights_only=False)["model"]


def merged_megatron_state(ckpt: Path, layout: Layout) -> dict[str, torch.Tensor]:
    """Full Megatron tensors under global names, from the per-rank files of data-parallel shard 0."""
    meta = json.loads((ckpt / "meta.json").read_text())
    if meta.get("backend") != "megatron":
        raise SystemExit(f"{ckpt}: not a megatron-backend checkpoint (backend {meta.get('backend', 'fsdp')}); "
                         "fsdp checkpoints are exported with --save-hf")
    tp, pp, ep = meta["tp"], meta.get("pp", 1), meta["ep"]
    stages = stage_layers(layout.num_layers, pp, meta.get("first_stage_layers"), meta.get("last_stage_layers"))
    shards: dict[str, list[torch.Tensor]] = {}
    for stage, layers in enumerate(stages):
        for e in range(ep):
            experts = expert_range(layout.num_experts, ep, e) if layout.num_experts else None
            for t in range(tp):
                for name, tensor in rank_state(ckpt, t, stage, e, (tp, pp, ep)).items():
                    if name.endswith("_extra_state") or tensor is None:
                        continue
                    if name == "output_layer.weight" and layout.tied and stage > 0:
                        continue  # the last stage's copy of the tied embedding
                    full_name = global_name(name, layers, experts)
                    if ".mlp.experts." in full_name:
                        if t == 0:  # experts are whole on each tensor rank
                            shards[full_name] = [tensor]
                    elif e == 0:
                        shards.setdefault(full_name, []).append(tensor)
    return {name: tp_merge(name, parts) for name, parts in shards.items()}


def convert(ckpt: str, hf_config: str, out: str) -> list[str]:
    from safetensors.torch import save_file
    from transformers import AutoConfig

    from relax.distributed.weights.receiver import load_hf_named
    from relax.utils.multimodal.models import copy_processor_files, is_multimodal, load_model

    config = AutoConfig.from_pretrained(hf_config)
    vision = VisionSide(config) if is_multimodal(config) else None
    layout = Layout.from_hf_config(config.text_config if vision else config)
    merged = merged_megatron_state(Path(ckpt), layout).items()
    state = {name: t.contiguous() for name, t in (vision.hf_tensors(merged, layout) if vision else
                                                  hf_tensors(merged, layout))}
    os.makedirs(out, exist_ok=True)
    if vision:  # a VL model: written by its HF class (the checkpoint's own names), with its processor files
        model = load_model(hf_config, config=config, from_config=True)
        load_hf_named(model, state)  # experts per expert into transformers' fused ones
        model.tie_weights()
        model.save_pretrained(out, safe_serialization=True)
        copy_processor_files(hf_config, out)
    else:
        save_file(state, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    config.save_pretrained(out)
    for name in os.listdir(hf_config):  # tokenizer, chat template, generation config
        if name.startswith(("tokenizer", "special_tokens", "vocab", "merges", "generation_config", "chat_template")):
            shutil.copy(os.path.join(hf_config, name), os.path.join(out, name))
    return sorted(state)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ckpt", required=True, help="the checkpoint directory (<save>/iter_N)")
    parser.add_argument("--hf-config", required=True, help="the HF model the run started from")
    parser.add_argument("--out", required=True, help="where to write the HF checkpoint")
    args = parser.parse_args(argv)
    names = convert(args.ckpt, args.hf_config, args.out)
    print(f"wrote {len(names)} tensors to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
