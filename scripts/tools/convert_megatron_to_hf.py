"""Convert a megatron-backend checkpoint (`<save>/iter_N`) to an HF checkpoint directory.

    python3 scripts/tools/convert_megatron_to_hf.py --ckpt outputs/run/ckpt/iter_0000039 \
        --hf-config path/to/original/hf/model --out outputs/run/hf-step40

The checkpoint holds one file per rank (`model/tp{t}_pp{p}_ep{e}[_etp{x}]_dp{d}.pt`) and `meta.json`
with the layout; one copy of each tensor rank's dense shards and of each (expert rank, expert tensor
rank)'s expert shards is read. `--hf-config` is the HF model it was trained from (its config.json and
tokenizer are copied); `--model-name` picks the conversion family as the run's flag of that name does.
Shards are merged and renamed by the same functions the backend pushes weights with
(`relax/backends/megatron/convert.py`): the output loads with `AutoModelForCausalLM.from_pretrained` and
in SGLang (a Qwen2.5-VL run's: its vision tower too, written by `AutoModelForImageTextToText` with the
processor files). No GPU or torch.distributed needed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout: relax/ imports

import torch  # noqa: E402

from relax.backends.megatron.convert import (  # noqa: E402
    Layout, expert_range, global_name, hf_tensors, stage_layers, tp_merge,
)
from relax.backends.megatron.vision import VisionSide  # noqa: E402


# A rank file: tp{t}_pp{p}_ep{e}[_etp{x}][_cp{c}]_dp{d}.pt (checkpoint.rank_file)
RANK_FILE = re.compile(r"^tp(\d+)_pp(\d+)_ep(\d+)(?:_etp(\d+))?(?:_cp(\d+))?_dp(\d+)\.pt$")


def place_files(ckpt: Path) -> dict[tuple[int, int, int, int], Path]:
    """(tensor rank, stage, expert rank, expert tensor rank) -> the file of that place with the lowest
    data-parallel rank (context-parallel ranks > 0 hold the same weights)."""
    best: dict[tuple[int, int, int, int], tuple[int, Path]] = {}
    for f in (ckpt / "model").glob("*.pt"):
        m = RANK_FILE.match(f.name)
        if m is None or int(m.group(5) or 0):
            continue
        key, dp = (int(m.group(1)), int(m.group(2)), int(m.group(3)), int(m.group(4) or 0)), int(m.group(6))
        if key not in best or dp < best[key][0]:
            best[key] = (dp, f)
    return {key: f for key, (_, f) in best.items()}


def pick(files: dict[tuple[int, int, int, int], Path], ckpt: Path, stage: int, **want: int) -> Path:
    """A file of pipeline stage `stage` at the wanted tensor (`tp`), expert (`ep`) or expert tensor
    (`etp`) rank."""
    index = {"tp": 0, "ep": 2, "etp": 3}
    found = [f for key, f in sorted(files.items()) if key[1] == stage and all(key[index[k]] == v for k, v in
                                                                               want.items())]
    if not found:
        raise SystemExit(f"{ckpt}/model has no rank file of stage {stage} with {want}: an incomplete checkpoint")
    return found[0]


def weights(state: dict[str, torch.Tensor]) -> list[tuple[str, torch.Tensor]]:
    """A rank file's weights (not megatron-core's `_extra_state` entries)."""
    return [(n, t) for n, t in state.items() if not n.endswith("_extra_state") and t is not None]


def merged_megatron_state(ckpt: Path, layout: Layout) -> dict[str, torch.Tensor]:
    """Full Megatron tensors under global names: dense weights from one file per tensor rank, expert
    weights from one file per (expert rank, expert tensor rank), each its lowest data-parallel copy."""
    meta = json.loads((ckpt / "meta.json").read_text())
    if meta.get("backend") != "megatron":
        raise SystemExit(f"{ckpt}: not a megatron-backend checkpoint (backend {meta.get('backend', 'fsdp')}); "
                         "fsdp checkpoints are exported with --save-hf")
    tp, pp, ep, etp = meta["tp"], meta.get("pp", 1), meta["ep"], meta.get("etp", 1)
    stages = stage_layers(layout.num_layers, pp, meta.get("first_stage_layers"), meta.get("last_stage_layers"))
    files, loaded = place_files(ckpt), {}

    def state(path: Path) -> dict[str, torch.Tensor]:
        if path not in loaded:
            loaded[path] = torch.load(path, map_location="cpu", weights_only=False)["model"]
        return loaded[path]

    shards: dict[str, list[torch.Tensor]] = {}
    for stage, layers in enumerate(stages):
        for t in range(tp):
            for name, tensor in weights(state(pick(files, ckpt, stage, tp=t))):
                if ".mlp.experts." in name:
                    continue
                if name == "output_layer.weight" and layout.tied and stage > 0:
                    continue  # the last stage's copy of the tied embedding
                shards.setdefault(global_name(name, layers), []).append(tensor)
        for e in range(ep if layout.num_experts else 0):
            experts = expert_range(layout.num_experts, ep, e)
            parts = [state(pick(files, ckpt, stage, ep=e, etp=x)) for x in range(etp)]
            for name in (n for n, _ in weights(parts[0]) if ".mlp.experts." in n):
                shards[global_name(name, layers, experts)] = [part[name] for part in parts]
    return {name: tp_merge(name, parts) for name, parts in shards.items()}


def convert(ckpt: str, hf_config: str, out: str, model_name: str | None = None) -> list[str]:
    from safetensors.torch import save_file
    from transformers import AutoConfig

    from relax.distributed.weights.receiver import load_hf_named
    from relax.utils.multimodal.models import copy_processor_files, is_multimodal, load_model

    config = AutoConfig.from_pretrained(hf_config)
    vision = VisionSide(config) if is_multimodal(config) else None
    layout = Layout.from_hf_config(config.text_config if vision else config, model_name)
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
    parser.add_argument("--model-name", default=None, help="the conversion family, as the run's --model-name "
                        "(default: the config's model_type)")
    args = parser.parse_args(argv)
    names = convert(args.ckpt, args.hf_config, args.out, args.model_name)
    print(f"wrote {len(names)} tensors to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
