"""On GPUs in bf16 (NCCL between ranks, bf16 compute over float32 main weights), the megatron
backend computes what the fsdp backend computes on one GPU: per-token log-probs before and after
one optimizer step, the loss and the gradient norm, within bf16 tolerance. The layouts that fit
the machine run: TP=1 on a dense and a MoE model (and padded rows, --qkv-format bshd) with one GPU;
TP=2 (also with --recompute-loss-function), TP=2 with sequence parallelism, PP=2, DP=2, EP=2 and
ETP=2 (MoE) with two, and TP=2 with and without sequence parallelism, PP=2, EP=2 and ETP=2 with each decoder
layer compiled through inductor (--use-torch-compile: AOT autograd's graphs, which the CPU run's eager-compiled
layers never build);
TP=2 x PP=2 with four. Each rank is a process
that sees one GPU, as Ray places trainer ranks. The same layouts are checked in float32 on the CPU
over gloo (megatron/test_parity.py, which hides the GPUs). Skipped without CUDA."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import statistics
import sys

import pytest
import torch

pytest.importorskip("megatron.core")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "megatron"))
import parity_cases  # noqa: E402

from relax.utils.net import free_ports  # noqa: E402

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not GPUS, reason="needs a CUDA GPU")]

# layout -> (GPUs, model, ModelParallelSpec kwargs)
# One-stage layouts pack their rows (--qkv-format thd, the default); "bshd" pads them.
LAYOUTS = {"tp1": (1, "dense", {}), "tp1_moe": (1, "moe", {}), "bshd": (1, "dense", {"qkv_format": "bshd"}),
           "tp2": (2, "dense", {"tp": 2}), "tp2sp": (2, "dense", {"tp": 2, "sequence_parallel": True}),
           "tp2_recompute": (2, "dense", {"tp": 2, "recompute_loss_function": True}),
           "pp2": (2, "dense", {"pp": 2}), "dp2": (2, "dense", {}), "ep2": (2, "moe", {"ep": 2}),
           "etp2": (2, "moe", {"etp": 2}), "tp2pp2": (4, "dense", {"tp": 2, "pp": 2}),
           # --use-torch-compile as on GPUs: each decoder layer through inductor (AOT autograd's graphs)
           "tp2_compiled": (2, "dense", {"tp": 2, "compiled": "inductor"}),
           "tp2sp_compiled": (2, "dense", {"tp": 2, "sequence_parallel": True, "compiled": "inductor"}),
           "pp2_compiled": (2, "dense", {"pp": 2, "compiled": "inductor"}),
           "ep2_compiled": (2, "moe", {"ep": 2, "compiled": "inductor"}),
           "etp2_compiled": (2, "moe", {"etp": 2, "compiled": "inductor"})}
MAX_LOGP, MEAN_LOGP, REL_NORM, ABS_LOSS = 0.05, 0.01, 0.02, 0.02  # bf16: 8 significant bits


def group_of(layout: str) -> tuple[int, str | None]:
    """The rank processes a layout runs in: its GPU count, and for compiled layers the model (the
    compiled layouts in processes of their own, a model's apart: `-k compiled` runs only them, and
    `-k "ep2_compiled or etp2_compiled"` only the MoE ones)."""
    gpus, model, parallel = LAYOUTS[layout]
    return gpus, model if parallel.get("compiled") else None


class Runs:
    """Results by layout, each group (`group_of`) run once, when a test of it first asks: `-k tp2pp2`
    runs the fsdp reference and the four-GPU group only."""

    def __init__(self, root: str):
        self.root, self.paths, self.out = root, parity_cases.make_models(root), {}
        self.failed: dict[tuple, str] = {}

    def reference(self, model: str) -> dict:
        if "fsdp" not in self.out:
            ref = [("fsdp", self.paths["dense"], {}), ("fsdp", self.paths["moe"], {})]
            parity_cases.run(0, 1, free_ports(len(ref)), ref, f"{self.root}/fsdp", bf16=True)
            fsdp = json.load(open(f"{self.root}/fsdp.0.json"))
            self.out["fsdp"] = {"dense": fsdp[0], "moe": fsdp[1]}
        return self.out["fsdp"][model]

    def layout(self, name: str) -> list[dict]:
        group = group_of(name)
        if name not in self.out and group not in self.failed:
            try:
                self._group(group)
            except AssertionError as exc:  # the group's other layouts fail with it, without a rerun
                self.failed[group] = str(exc)
        if group in self.failed:
            pytest.fail(self.failed[group])
        return self.out[name]

    def _group(self, group: tuple[int, str | None]) -> None:
        gpus = group[0]
        names = [n for n in LAYOUTS if group_of(n) == group]
        cases = [("megatron", self.paths[LAYOUTS[n][1]], LAYOUTS[n][2]) for n in names]
        port, prefix = free_ports(len(cases)), f"{self.root}/g{gpus}{group[1] or ''}"
        if gpus == 1:
            parity_cases.run(0, 1, port, cases, prefix, bf16=True)
        else:
            ctx = mp.get_context("spawn")
            procs = [ctx.Process(target=parity_cases.run_on_gpu, args=(r, gpus, port, cases, prefix))
                     for r in range(gpus)]
            for p in procs:
                p.start()
            parity_cases.join_ranks(procs, 600, f"the {gpus}-GPU megatron group")
        ranks = [json.load(open(f"{prefix}.{r}.json")) for r in range(gpus)]
        for i, name in enumerate(names):
            self.out[name] = [rank[i] for rank in ranks]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return Runs(str(tmp_path_factory.mktemp("gpu_parity")))


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_megatron_matches_fsdp_in_bf16_on_gpus(runs, layout):
    gpus, model, _ = LAYOUTS[layout]
    if gpus > GPUS:
        pytest.skip(f"{layout} needs {gpus} GPUs; this machine has {GPUS}")
    ref, ranks = runs.reference(model), runs.layout(layout)
    diffs = []
    for res in ranks:
        assert res["metrics"]["grad_norm"] == pytest.approx(ref["metrics"]["grad_norm"], rel=REL_NORM), layout
        if not res["info"]["output"]:  # a tensor rank > 0 or a stage before the last
            continue
        for key in ("before", "after"):
            for row, values in zip(res["rows"], res[key]):
                diffs += [abs(a - b) for a, b in zip(values, ref[key][row])]
    assert max(diffs) <= MAX_LOGP and statistics.mean(diffs) <= MEAN_LOGP, \
        f"{layout}: log-prob |diff| max {max(diffs):.4f} mean {statistics.mean(diffs):.5f}"
    answering = [r for r in ranks if r["info"]["output"]]
    assert len(answering) == ranks[0]["info"]["dp_size"]
    loss = sum(r["metrics"]["pg_loss"] for r in answering) / len(answering)
    assert loss == pytest.approx(ref["metrics"]["pg_loss"], abs=ABS_LOSS)
    print(f"{layout}: log-prob |diff| max {max(diffs):.4f} mean {statistics.mean(diffs):.5f}, grad norm "
          f"{ranks[0]['metrics']['grad_norm']:.4f} (fsdp {ref['metrics']['grad_norm']:.4f}), graph breaks "
          f"{[r['graph_breaks'] for r in ranks]}, graphs {[r['graphs'] for r in ranks]}")
