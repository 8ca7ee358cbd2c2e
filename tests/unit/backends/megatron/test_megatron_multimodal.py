"""A vision-language or omni model on the megatron backend computes what the fsdp backend computes
(fp32, gloo, real processes): a tiny Qwen3-VL (interleaved M-RoPE, deepstack features) and a tiny
Qwen3-Omni thinker (its audio tower too; a MoE language model), rows with
images, a video, audio and text rows;
per-token log-probs before and after one optimizer step and the gradient norm, for megatron on
one rank, TP=2 (VL), TP=2 with sequence parallelism, DP=2 and EP=2 (omni) against fsdp on one rank. The media
really count (without them the media rows score differently), the step trains the vision tower,
and the weights go out under the HF model's own names (what fsdp sends). Start-up refuses what
is not built with errors that say so."""

from __future__ import annotations

import json
import os
import sys

import pytest

pytest.importorskip("megatron.core")
sys.path.insert(0, os.path.dirname(__file__))
import vl_cases  # noqa: E402

from relax.utils.net import free_port, free_ports  # noqa: E402

# After a step the weights differ by Adam's normalisation of near-zero gradients (~1e-4 of lr 1e-2 on
# some weights): the log-probs after it agree less tightly than before it.
ATOL_LOGP, ATOL_AFTER, RTOL_NORM = 1e-4, 5e-4, 1e-4
TP2SP, DP2 = {"tp": 2, "sequence_parallel": True}, {}
TWO = {"dense": {"tp2": {"tp": 2}, "tp2sp": TP2SP, "dp2": DP2},  # two-rank layouts, by language model
       "moe": {"tp2sp": TP2SP, "dp2": DP2, "ep2": {"ep": 2}}}  # (MoE with TP needs sequence parallelism)
LAYOUTS = ["tp1", "tp2", "tp2sp", "dp2", "ep2"]


def two_rank_layouts(kind: str) -> dict[str, dict]:
    return TWO["moe" if kind == "qwen3_omni" else "dense"]


# Qwen2.5-VL on megatron (sectioned M-RoPE, q/k/v biases) runs whole in
# tests/integration/test_multimodal_run.py, whose engine-vs-megatron log-prob check covers it.
@pytest.fixture(scope="module", params=["qwen3_vl", "qwen3_omni"])
def runs(request, tmp_path_factory, rank_pool):
    root = str(tmp_path_factory.mktemp(request.param))
    model, data = vl_cases.make_data(root, request.param)
    layouts = two_rank_layouts(request.param)
    two = [("megatron", p) for p in layouts.values()]
    port, port1 = free_ports(len(two)), free_ports(2)
    job = rank_pool.submit(vl_cases.run, [(r, 2, port, two, model, data, f"{root}/two") for r in range(2)],
                           "the two-rank megatron group")
    vl_cases.run(0, 1, port1, [("fsdp", {}), ("megatron", {})], model, data, f"{root}/one")
    rank_pool.wait(job, 600)
    load = lambda name: json.load(open(f"{root}/{name}.json"))  # noqa: E731
    one, two0, two1 = load("one.0"), load("two.0"), load("two.1")
    out = {"root": root, "model": model, "data": data, "kind": request.param, "fsdp": one[0], "tp1": [one[1]],
           "cases": {name: k for k, name in enumerate(layouts)}}
    out |= {name: [two0[k], two1[k]] for k, name in enumerate(layouts)}
    return out


def layout_of(runs: dict, layout: str) -> list[dict]:
    if layout not in runs:
        pytest.skip(f"{layout} is not a layout of the {runs['kind']} model (MoE: TP with SP; dense: no EP)")
    return runs[layout]


def per_expert(state: dict) -> dict:
    """HF weights with fused MoE experts (transformers' in-memory `mlp.experts.gate_up_proj`) named
    per expert, as checkpoints, SGLang and the megatron backend name them."""
    import torch

    from relax.distributed.weights.receiver import expert_views

    tensors = {k: v if isinstance(v, torch.Tensor) else torch.tensor(v) for k, v in state.items()}
    views = expert_views(tensors)
    fused = {k for k, v in tensors.items() if k.rsplit(".", 1)[0].endswith("mlp.experts") and v.dim() == 3}
    return {k: v for k, v in tensors.items() if k not in fused} | views


@pytest.mark.parametrize("layout", LAYOUTS)
def test_megatron_matches_fsdp_on_media_rows(runs, layout):
    ref = runs["fsdp"]
    for res in layout_of(runs, layout):
        assert res["metrics"]["grad_norm"] == pytest.approx(ref["metrics"]["grad_norm"], rel=RTOL_NORM)
        if not res["info"]["output"]:
            continue
        for key in ("before", "after", "blind"):
            for row, values in zip(res["rows"], res[key]):
                atol = ATOL_AFTER if key == "after" else ATOL_LOGP
                assert values == pytest.approx(ref[key][row], abs=atol), (layout, key, row)
        for row, with_media, without in zip(res["rows"], res["before"], res["blind"]):
            has_media = "<" in vl_cases.contents(runs["kind"])[row]
            differs = max(abs(a - b) for a, b in zip(with_media, without)) > 1e-3
            assert differs == has_media, (layout, row)  # the pixels, frames and waveforms reach the model
    from relax.backends.megatron.vision import tower_of

    moved = {tower_of(name) for name in layout_of(runs, layout)[0]["moved"]}
    for tower in ("visual", "audio_tower") if runs["kind"] == "qwen3_omni" else ("visual",):
        assert tower in moved, f"the step did not train the {tower}"


@pytest.mark.parametrize("layout", ["tp1", "tp2", "tp2sp", "ep2"])
def test_pushed_weights_are_the_hf_models_names(runs, layout):
    """Rank 0 pushes the HF model's names (experts per expert, as the engines take them): before the
    step exactly the checkpoint's weights (the conversion both ways), after it the weights fsdp
    has after the same step (Adam's first step moves each weight by about lr = 1e-2 whatever its
    gradient's size, so an element whose gradient is ~1e-9 may move either way: a few elements
    are allowed off)."""
    import torch

    res, ref = layout_of(runs, layout)[0], runs["fsdp"]
    start, ref_start = res["start"], per_expert(ref["start"])
    from relax.backends.megatron.vision import tower_of

    assert set(start) == set(ref_start) and any(tower_of(n) == "visual" for n in start)
    for name, values in start.items():
        assert torch.allclose(torch.tensor(values), ref_start[name], atol=1e-6), name
    hf, ref_after = res["hf"], per_expert(ref["hf"])
    assert set(hf) == set(ref_after)
    off = sum(int(((torch.tensor(v) - ref_after[n]).abs() > 1e-3).sum()) for n, v in hf.items())
    total = sum(t.numel() for t in ref_after.values())
    assert off <= 1e-3 * total, f"{off} of {total} weights differ from fsdp's after the step by > 1e-3"


def test_actor_fwd_takes_pushed_vl_weights(runs):
    """Fully async on megatron: ActorFwd's receiver places the text weights (the model's names)
    in its shards and the encoders' in the encoders, then scores as the trainer that sent them."""
    sender = runs["tp1"][0]
    got = vl_cases.receive(runs["model"], runs["data"], sender["hf"], free_port())
    assert got["problems"] == [] and got["finished"], got["message"]
    assert any("blocks.9" in p and "not a weight" in p for p in got["bad"])
    assert any("patch_embed" in p and "shape [1, 2]" in p for p in got["bad"])
    for row, values in enumerate(got["scores"]):
        assert values == pytest.approx(sender["after"][row], abs=ATOL_LOGP), row


@pytest.mark.parametrize("layout", ["tp2", "tp2sp", "ep2"])
def test_checkpoint_and_export_give_the_pushed_weights(runs, layout, tmp_path):
    """scripts/tools/convert_megatron_to_hf.py on a two-rank VL checkpoint, and --save-hf's export,
    give the weights the backend pushed; both load as an HF VL model with the processor files."""
    import importlib.util

    import torch
    from transformers import AutoImageProcessor, AutoModelForImageTextToText

    script = os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "scripts", "tools",
                          "convert_megatron_to_hf.py")
    spec = importlib.util.spec_from_file_location("convert_megatron_to_hf", script)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    converted = tmp_path / "hf"
    pushed = layout_of(runs, layout)[0]["hf"]
    case = runs["cases"][layout]
    tool.main(["--ckpt", f"{runs['root']}/two-ckpt{case}", "--hf-config", runs["model"], "--out", str(converted)])
    for out in (converted, f"{runs['root']}/one-hf1"):  # the converter's; the one-rank run's --save-hf
        model = AutoModelForImageTextToText.from_pretrained(out)
        AutoImageProcessor.from_pretrained(out)
        state = per_expert(dict(model.named_parameters()))
        ref = pushed if out == converted else runs["tp1"][0]["hf"]
        assert set(state) == set(ref)
        for name, p in state.items():
            assert torch.allclose(p, torch.tensor(ref[name]), atol=1e-6), (out, name)


def test_start_up_refuses_what_is_not_built():
    from types import SimpleNamespace

    from relax.backends.megatron.convert import ConversionError
    from relax.backends.megatron.vision import check_supported

    with pytest.raises(ConversionError, match="qwen3_vl_moe.*use --train-backend fsdp"):
        check_supported(SimpleNamespace(model_type="qwen3_vl_moe"), 1, 1)
    qwen25 = SimpleNamespace(model_type="qwen2_5_vl")
    check_supported(qwen25, 1, 1)
    with pytest.raises(ConversionError, match="--pipeline-model-parallel-size 2"):
        check_supported(qwen25, 2, 1)
    with pytest.raises(ConversionError, match="--context-parallel-size 2"):
        check_supported(qwen25, 1, 2)
