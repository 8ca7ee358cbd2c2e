"""A vision-language model on the megatron backend computes what the fsdp backend computes (fp32,
gloo, real processes): a tiny Qwen2.5-VL and a tiny Qwen3-VL (interleaved M-RoPE, deepstack
features), rows with one or two images, a video and text rows;
per-token log-probs before and after one optimizer step and the gradient norm, for megatron on
one rank, TP=2, TP=2 with sequence parallelism and DP=2 against fsdp on one rank. The media
really count (without them the media rows score differently), the step trains the vision tower,
and the weights go out under the HF model's own names (what fsdp sends). Start-up refuses what
is not built with errors that say so."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import sys

import pytest

pytest.importorskip("megatron.core")
sys.path.insert(0, os.path.dirname(__file__))
import vl_cases  # noqa: E402

from relax.utils.net import free_port  # noqa: E402

ATOL_LOGP, RTOL_NORM = 1e-4, 1e-4
TWO = {"tp2": {"tp": 2}, "tp2sp": {"tp": 2, "sequence_parallel": True}, "dp2": {}}


@pytest.fixture(scope="module", params=["qwen2_5_vl", "qwen3_vl"])
def runs(request, tmp_path_factory):
    root = str(tmp_path_factory.mktemp(request.param))
    model, data = vl_cases.make_data(root, request.param)
    port = free_port()
    ctx = mp.get_context("spawn")
    two = [("megatron", p) for p in TWO.values()]
    procs = [ctx.Process(target=vl_cases.run, args=(r, 2, port, two, model, data, f"{root}/two")) for r in range(2)]
    for p in procs:
        p.start()
    vl_cases.run(0, 1, free_port(), [("fsdp", {}), ("megatron", {})], model, data, f"{root}/one")
    for p in procs:
        p.join(timeout=600)
        assert p.exitcode == 0, f"a two-rank megatron process failed (exit {p.exitcode}); its output is above"
    load = lambda name: json.load(open(f"{root}/{name}.json"))  # noqa: E731
    one, two0, two1 = load("one.0"), load("two.0"), load("two.1")
    out = {"root": root, "model": model, "data": data, "fsdp": one[0], "tp1": [one[1]]}
    out |= {name: [two0[k], two1[k]] for k, name in enumerate(TWO)}
    return out


@pytest.mark.parametrize("layout", ["tp1", *TWO])
def test_megatron_matches_fsdp_on_media_rows(runs, layout):
    ref = runs["fsdp"]
    for res in runs[layout]:
        assert res["metrics"]["grad_norm"] == pytest.approx(ref["metrics"]["grad_norm"], rel=RTOL_NORM)
        if not res["info"]["output"]:
            continue
        for key in ("before", "after", "blind"):
            for row, values in zip(res["rows"], res[key]):
                assert values == pytest.approx(ref[key][row], abs=ATOL_LOGP), (layout, key, row)
        for row, with_media, without in zip(res["rows"], res["before"], res["blind"]):
            has_media = "<" in vl_cases.CONTENTS[row]
            differs = max(abs(a - b) for a, b in zip(with_media, without)) > 1e-3
            assert differs == has_media, (layout, row)  # the pixels and frames reach the model
    assert any(".visual." in name for name in runs[layout][0]["moved"]), "the step did not train the vision tower"


@pytest.mark.parametrize("layout", ["tp1", "tp2", "tp2sp"])
def test_pushed_weights_are_the_hf_models_names(runs, layout):
    import torch

    hf, ref = runs[layout][0]["hf"], runs["fsdp"]["hf"]
    assert set(hf) == set(ref) and any(n.startswith("model.visual.") for n in hf)
    for name, values in hf.items():  # after the same step (Adam's first step: ~lr per weight)
        assert torch.allclose(torch.tensor(values), torch.tensor(ref[name]), atol=1e-3), name


def test_actor_fwd_takes_pushed_vl_weights(runs):
    """Fully async on megatron: ActorFwd's receiver places the text weights (VL names) in its
    shards and the tower's in the tower, then scores as the trainer that sent them."""
    ref = runs["fsdp"]
    got = vl_cases.receive(runs["model"], runs["data"], ref["hf"], free_port())
    assert got["problems"] == [] and got["finished"], got["message"]
    assert any("blocks.9" in p and "not a weight" in p for p in got["bad"])
    assert any("patch_embed" in p and "shape [1, 2]" in p for p in got["bad"])
    for row, values in enumerate(got["scores"]):
        assert values == pytest.approx(ref["after"][row], abs=ATOL_LOGP), row


@pytest.mark.parametrize("case,layout", [(0, "tp2"), (1, "tp2sp")])
def test_checkpoint_and_export_give_the_pushed_weights(runs, case, layout, tmp_path):
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
    tool.main(["--ckpt", f"{runs['root']}/two-ckpt{case}", "--hf-config", runs["model"], "--out", str(converted)])
    pushed = runs[layout][0]["hf"]
    for out in (converted, f"{runs['root']}/one-hf1"):  # the converter's; the one-rank run's --save-hf
        model = AutoModelForImageTextToText.from_pretrained(out)
        AutoImageProcessor.from_pretrained(out)
        state = dict(model.named_parameters())
        ref = pushed if out == converted else runs["tp1"][0]["hf"]
        assert set(state) == set(ref)
        for name, p in state.items():
            assert torch.allclose(p, torch.tensor(ref[name]), atol=1e-6), (out, name)


def test_start_up_refuses_what_is_not_built():
    from types import SimpleNamespace

    from relax.backends.megatron.convert import ConversionError
    from relax.backends.megatron.vision import check_supported

    for moe in ("qwen3_vl_moe", "qwen3_omni_moe_thinker"):
        with pytest.raises(ConversionError, match=f"{moe}.*use --train-backend fsdp"):
            check_supported(SimpleNamespace(model_type=moe), 1, 1)
    qwen25 = SimpleNamespace(model_type="qwen2_5_vl")
    check_supported(qwen25, 1, 1)
    with pytest.raises(ConversionError, match="--pipeline-model-parallel-size 2"):
        check_supported(qwen25, 2, 1)
    with pytest.raises(ConversionError, match="--context-parallel-size 2"):
        check_supported(qwen25, 1, 2)
