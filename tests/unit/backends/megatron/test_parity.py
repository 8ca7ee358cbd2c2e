"""The megatron backend computes what the fsdp backend computes (fp32, gloo, real processes).

On a tiny Qwen3 (tied embeddings) and a tiny Qwen3-MoE (untied, 4 experts, top-2): per-token log-probs before and
after one optimizer step, the gradient norm and the loss, for megatron with TP=1, TP=2, TP=2 with sequence
parallelism (and --recompute-loss-function), DP=2 (also with the distributed optimizer under the optimizer offload
and overlap flags, `OVERLAPPED`), PP=2, EP=2, ETP=2 (each expert split over two data-parallel ranks that gather each
other's tokens; with --use-distributed-optimizer, which then keeps the state unsharded: ZeRO-1 would broadcast one
rank's expert shards over the other's), CP=2 (context parallelism: each row split into 4 chunks, 2 per rank; with
--allgather-cp into 2 contiguous ones), with each decoder layer compiled (dynamo, no kernel compiler) TP=2, and
through AOT autograd TP=2 with sequence parallelism, EP=2 and PP=2; TP=2 x PP=2 and DP=2 x PP=2 (MoE), against fsdp
on one rank. The one-stage layouts pack their micro-batches (--qkv-format thd, the default); `bshd` pads them (and
builds its model through a --custom-model-provider-path that wraps the default one). Layouts of two ranks run in the
session's rank processes (tests/rank_pool.py), of four in spawned ones (`parity_cases.run`, which also reports the
HF-named weights each pushes)."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import sys

import pytest

pytest.importorskip("megatron.core")
sys.path.insert(0, os.path.dirname(__file__))
import parity_cases  # noqa: E402

from relax.utils.net import free_ports  # noqa: E402

ATOL_LOGP, ATOL_NORM = 1e-5, 1e-4
# The seeds' optimizer flags on the DP=2 ZeRO-1 case: each rank offloads its shard to the host and steps it
# there (chunked copies), gradients are all-reduced during the last backward, the weight broadcast is waited
# for by the next forward. The DP=2 x PP=2 MoE case reduces its dense gradients during backward too (the
# pipeline schedule's no_sync_func).
OVERLAPPED = dict(optimizer_cpu_offload=True, overlap_cpu_optimizer_d2h_h2d=True, overlap_grad_reduce=True,
                  overlap_param_gather=True)
# --qkv-format bshd, through a --custom-model-provider-path that wraps the default model (one in-process case).
BSHD = {"qkv_format": "bshd", "model_provider": "parity_cases.wrapping_provider"}
ETP_ZERO = {"etp": 2, "distributed_optimizer": True}


@pytest.fixture(scope="module")
def runs(tmp_path_factory, rank_pool):
    root = str(tmp_path_factory.mktemp("parity"))
    paths = parity_cases.make_models(root)
    one = [("fsdp", paths["dense"], {}), ("megatron", paths["dense"], {}),
           ("fsdp", paths["moe"], {}), ("megatron", paths["moe"], {}), ("megatron", paths["dense"], BSHD)]
    two = [("megatron", paths["dense"], {"tp": 2}), ("megatron", paths["dense"], {}),
           ("megatron", paths["moe"], {"ep": 2}), ("megatron", paths["dense"], {"pp": 2}),
           ("megatron", paths["moe"], {"pp": 2}),
           ("megatron", paths["dense"], {"tp": 2, "sequence_parallel": True, "recompute_loss_function": True}),
           ("megatron", paths["moe"], {"tp": 2, "sequence_parallel": True}),
           ("megatron", paths["dense"], {"distributed_optimizer": True, **OVERLAPPED}),
           ("megatron", paths["dense"], {"cp": 2}), ("megatron", paths["moe"], ETP_ZERO),
           ("megatron", paths["dense"], {"cp": 2, "allgather_cp": True}),
           ("megatron", paths["dense"], {"tp": 2, "compiled": True})]
    # Four ranks: pipeline stages beside tensor or data-parallel ranks (stage leaders send the weights).
    four = [("megatron", paths["dense"], {"tp": 2, "pp": 2}),
            ("megatron", paths["moe"], {"pp": 2, "overlap_grad_reduce": True})]
    # TP=2 with sequence parallelism, compiled, as the first case of its processes: traced after other cases
    # in the same process (their groups destroyed, new ones made) its all-gathers broke the graph 32 times.
    # Through AOT autograd, as inductor compiles it on GPUs (its sequence-parallel collectives differentiable:
    # relax/backends/megatron/compile_shim.py), without the kernel compiler.
    # Then EP=2 compiled the same way (the MoE block runs uncompiled in the compiled layer: compile_shim), and PP=2.
    compiled_sp = [("megatron", paths["dense"], {"tp": 2, "sequence_parallel": True, "compiled": "aot_eager"}),
                   ("megatron", paths["moe"], {"ep": 2, "compiled": "aot_eager"}),
                   ("megatron", paths["dense"], {"pp": 2, "compiled": "aot_eager"})]
    # Case i of a group uses its ports[i] (parity_cases.run), every port distinct.
    ports = free_ports(len(two) + len(four) + len(one) + len(compiled_sp))
    port, port4 = ports[:len(two)], ports[len(two):len(two) + len(four)]
    port1, port_sp = ports[len(two) + len(four):-len(compiled_sp)], ports[-len(compiled_sp):]
    job = rank_pool.submit(parity_cases.run, [(r, 2, port, two, f"{root}/two") for r in range(2)],
                           "the two-rank megatron group")
    ctx = mp.get_context("spawn")  # (four ranks, and the compiled pair: processes of their own)
    procs = [ctx.Process(target=parity_cases.run, args=(r, 4, port4, four, f"{root}/four")) for r in range(4)]
    procs += [ctx.Process(target=parity_cases.run, args=(r, 2, port_sp, compiled_sp, f"{root}/sp"))
              for r in range(2)]
    for p in procs:
        p.start()
    parity_cases.run(0, 1, port1, one, f"{root}/one")
    try:
        rank_pool.wait(job, 600)
    finally:
        parity_cases.join_ranks(procs, 600, "the four-rank megatron group and the compiled pair")
    load = lambda name: json.load(open(f"{root}/{name}.json"))  # noqa: E731
    single = load("one.0")
    return {"root": root, "paths": paths, "fsdp": {"dense": single[0], "moe": single[2]},
            "tp1": {"dense": [single[1]]}, "tp1_moe": {"moe": [single[3]]}, "bshd": {"dense": [single[4]]},
            "tp2": {"dense": [load("two.0")[0], load("two.1")[0]]},
            "dp2": {"dense": [load("two.0")[1], load("two.1")[1]]},
            "ep2": {"moe": [load("two.0")[2], load("two.1")[2]]},
            "pp2": {"dense": [load("two.0")[3], load("two.1")[3]], "moe": [load("two.0")[4], load("two.1")[4]]},
            "tp2sp": {"dense": [load("two.0")[5], load("two.1")[5]], "moe": [load("two.0")[6], load("two.1")[6]]},
            "dp2zero": {"dense": [load("two.0")[7], load("two.1")[7]]},
            "cp2": {"dense": [load("two.0")[8], load("two.1")[8]]},
            "etp2": {"moe": [load("two.0")[9], load("two.1")[9]]},
            "cp2ag": {"dense": [load("two.0")[10], load("two.1")[10]]},
            "tp2compiled": {"dense": [load("two.0")[11], load("two.1")[11]]},
            "tp2pp2": {"dense": [load(f"four.{r}")[0] for r in range(4)]},
            "dp2pp2": {"moe": [load(f"four.{r}")[1] for r in range(4)]},
            "tp2spcompiled": {"dense": [load(f"sp.{r}")[0] for r in range(2)]},
            "ep2compiled": {"moe": [load(f"sp.{r}")[1] for r in range(2)]},
            "pp2compiled": {"dense": [load(f"sp.{r}")[2] for r in range(2)]}}


@pytest.mark.parametrize("layout,model", [("tp1", "dense"), ("tp2", "dense"), ("dp2", "dense"), ("pp2", "dense"),
                                          ("tp2sp", "dense"), ("dp2zero", "dense"), ("cp2", "dense"),
                                          ("tp1_moe", "moe"), ("tp2pp2", "dense"), ("dp2pp2", "moe"),
                                          ("ep2", "moe"), ("pp2", "moe"), ("tp2sp", "moe"), ("bshd", "dense"),
                                          ("etp2", "moe"), ("cp2ag", "dense"), ("tp2compiled", "dense"),
                                          ("tp2spcompiled", "dense"), ("ep2compiled", "moe"),
                                          ("pp2compiled", "dense")])
def test_megatron_matches_fsdp(runs, layout, model):
    ref, ranks = runs["fsdp"][model], runs[layout][model]
    for res in ranks:
        assert res["metrics"]["grad_norm"] == pytest.approx(ref["metrics"]["grad_norm"], abs=ATOL_NORM)
        if not res["info"]["output"]:  # tensor rank > 0 (same values), or a stage before the last (none)
            continue
        for key in ("before", "after"):  # after: the optimizer step moved both the same way
            for row, values in zip(res["rows"], res[key]):
                assert values == pytest.approx(ref[key][row], abs=ATOL_LOGP), (layout, key, row)
    dp = ranks[0]["info"]["dp_size"]
    answering = [r for r in ranks if r["info"]["output"]]
    assert len(answering) == dp  # one rank answers per data-parallel shard
    loss = sum(r["metrics"]["pg_loss"] for r in answering) / dp  # each shard's share of the global mean
    assert loss == pytest.approx(ref["metrics"]["pg_loss"], abs=ATOL_NORM)


def test_compiled_tensor_parallel_layers_are_one_graph_each(runs):
    """--use-torch-compile at TP=2: no graph break in the decoder layers (compile_shim: the input
    gradient's all-reduce traced, not async), and the same log-probs and gradients (test above)."""
    assert [r["graph_breaks"] for r in runs["tp2compiled"]["dense"]] == [0, 0]
    assert [r["graph_breaks"] for r in runs["tp2spcompiled"]["dense"]] == [0, 0]  # and with sequence parallelism
    # one graph for both layers (a function set on each linear would recompile each: compile_shim._gathering_forward)
    assert runs["tp2spcompiled"]["dense"][0]["graphs"] <= runs["tp2compiled"]["dense"][0]["graphs"]


def test_the_optimizer_flags_acted_in_their_cases(runs):
    """dp2zero: each rank stepped its shard on the host, reduced every gradient bucket during the
    last backward and left its weight broadcasts to the next forward; dp2pp2: each stage reduced its
    dense buckets in the last backward of the pipeline schedule; the plain DP=2 case did neither."""
    for res in runs["dp2zero"]["dense"]:
        acted = res["acted"]
        assert acted["host_optimizer"] and acted["param_broadcasts"] > 0
        launched, buckets = acted["grad_buckets"]
        assert launched == buckets >= 1
    for res in runs["dp2pp2"]["moe"]:
        launched, buckets = res["acted"]["grad_buckets"]
        assert launched == buckets >= 1 and not res["acted"]["host_optimizer"]
    for res in runs["dp2"]["dense"]:
        assert res["acted"] == {"host_optimizer": False, "grad_buckets": None, "param_broadcasts": None,
                                "packed": True, "provided_forwards": None}


def test_thd_packs_rows_and_matches_bshd(runs):
    """--qkv-format thd (the default) packed every one-stage layout's micro-batches, bshd padded them and
    pipeline / context-parallel layouts pad (the plan says so); packed and padded rows give the same
    log-probs before and after the step. The bshd case built its model through the wrapping
    --custom-model-provider-path, whose model ran every forward."""
    for layout, model in (("tp1", "dense"), ("tp1_moe", "moe"), ("tp2sp", "dense"), ("ep2", "moe"),
                          ("etp2", "moe")):
        assert all(res["acted"]["packed"] for res in runs[layout][model]), layout
    for layout in ("pp2", "cp2", "cp2ag"):
        assert not any(res["acted"]["packed"] for res in runs[layout]["dense"]), layout
    thd, bshd = runs["tp1"]["dense"][0], runs["bshd"]["dense"][0]
    assert not bshd["acted"]["packed"] and bshd["acted"]["provided_forwards"] >= 3
    assert thd["acted"]["provided_forwards"] is None
    for key in ("before", "after"):
        for packed_row, padded_row in zip(thd[key], bshd[key]):
            assert packed_row == pytest.approx(padded_row, abs=1e-6)


@pytest.mark.parametrize("layout,model", [("tp1", "dense"), ("tp2", "dense"), ("pp2", "dense"), ("cp2", "dense"),
                                          ("tp2pp2", "dense"), ("ep2", "moe"), ("pp2", "moe"), ("dp2pp2", "moe"),
                                          ("etp2", "moe")])
def test_pushed_weights_are_the_checkpoints_names(runs, layout, model):
    """Rank 0 sends HF checkpoint names; dense ones equal what fsdp sends after the same step."""
    hf = runs[layout][model][0]["hf"]
    assert "model.embed_tokens.weight" in hf and "model.layers.1.self_attn.q_norm.weight" in hf
    if model == "moe":
        assert {f"model.layers.0.mlp.experts.{e}.gate_proj.weight" for e in range(4)} <= set(hf)
        return
    ref = runs["fsdp"][model]["hf"]
    assert set(hf) == set(ref)
    import torch

    for name, values in hf.items():
        assert torch.allclose(torch.tensor(values), torch.tensor(ref[name]), atol=1e-4), name


@pytest.mark.parametrize("case,layout,model", [(0, "tp2", "dense"), (2, "ep2", "moe"), (3, "pp2", "dense"),
                                               (4, "pp2", "moe"), (8, "cp2", "dense"), (9, "etp2", "moe")])
def test_checkpoint_converts_to_the_pushed_hf_weights(runs, case, layout, model, tmp_path):
    """scripts/tools/convert_megatron_to_hf.py on a two-rank checkpoint gives, bit for bit, the
    weights the backend pushed; the result loads as an HF model."""
    import importlib.util

    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    script = os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "scripts", "tools",
                          "convert_megatron_to_hf.py")
    spec = importlib.util.spec_from_file_location("convert_megatron_to_hf", script)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    out = tmp_path / "hf"
    tool.main(["--ckpt", f"{runs['root']}/two-ckpt{case}", "--hf-config", runs["paths"][model], "--out", str(out)])
    state = load_file(str(out / "model.safetensors"))
    pushed = runs[layout][model][0]["hf"]
    assert set(state) == set(pushed)
    for name, tensor in state.items():
        assert torch.equal(tensor, torch.tensor(pushed[name])), name
    AutoModelForCausalLM.from_pretrained(out)
