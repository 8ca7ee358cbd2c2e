"""The per-model GPU recipes (scripts/training/{text,multimodal}/run-qwen3-*-Nxgpu*.sh) resolve and fit
the cluster they are written for: each runs as a user runs it (bash, its own flags, `"$@"` appended)
with `--dry-run --cluster '{"nodes": N, "gpus_per_node": 8}'`, no GPU and no weights.

No checkpoint exists here, so the test builds config-only model directories: the published
config.json of each model (the values tests/unit/scripts/test_model_scripts.py checks the
scripts/models/*.sh files against), which is all a dry run reads of a checkpoint (architecture,
vocabulary), and a one-row data file of the recipe's format. The recipe's MODEL_ARGS are checked
against that config.json by the megatron backend's own checks, the plan is resolved for the
cluster (sglang and megatron, fsdp for the whole Omni model, as on the GPU image) and placed node by node."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from tests.unit.scripts.test_model_scripts import multimodal_config, write_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
TEXT_ROW = {"prompt": [{"role": "user", "content": "What is 1+1?"}], "label": "2"}
# recipe -> (nodes, model script, model dir under MODEL_DIR, data file under DATA_DIR, the roles per node)
RECIPES = {
    "text/run-qwen3-4B-8xgpu.sh": (1, "qwen3-4B.sh", "Qwen3-4B", "dapo-math-17k/dapo-math-17k.jsonl",
                                   ["actor, rollout, dcs"]),
    "text/run-qwen3-4B-8xgpu-async.sh": (1, "qwen3-4B.sh", "Qwen3-4B", "dapo-math-17k/dapo-math-17k.jsonl",
                                         ["actor, rollout, actor_fwd, advantages, dcs"]),
    "text/run-qwen3-30B-A3B-16xgpu.sh": (2, "qwen3-30B-A3B.sh", "Qwen3-30B-A3B", "dapo-math-17k/dapo-math-17k.jsonl",
                                         ["actor, advantages, dcs", "rollout"]),
    "multimodal/run-qwen3-vl-4B-8xgpu.sh": (
        1, "qwen3-vl-4B.sh", "Qwen3-VL-4B-Instruct",
        "multimodal-open-r1-8k-verified/data/train-00000-of-00001-test.parquet", ["actor, rollout, dcs"]),
    "multimodal/run-qwen3-30B-A3B-omni-16xgpu.sh": (
        2, "qwen3-omni-30B-A3B.sh", "Qwen3-Omni-30B-A3B-Instruct",
        "AVQA-R1-6K/AVQA_R1/train/omni_rl_format_train_test.jsonl", ["actor, advantages, dcs", "rollout"]),
}


def model_dir(root, script: str, name: str) -> None:
    """A config-only checkpoint: the model's published config.json."""
    if "vl" in script or "omni" in script:
        multimodal_config(script).save_pretrained(root / name)
    else:
        path, _ = write_config(root, script)
        path.rename(root / name)


def data_file(root, relative: str) -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".parquet":
        import pandas as pd

        row = {"prompt": [{"role": "user", "content": "<image>How many?"}], "label": "2", "image": ["a.png"]}
        pd.DataFrame([row]).to_parquet(path)
    else:
        row = dict(TEXT_ROW)
        if "AVQA" in relative:
            row = {"prompt": [{"role": "user", "content": "<image><audio>Which? A. x B. y"}],
                   "label": "<answer>B</answer>", "image_key": ["a.png"], "audio_key": ["a.wav"]}
        path.write_text(json.dumps(row) + "\n")


@pytest.fixture(scope="module")
def exp_dir(tmp_path_factory):
    """EXP_DIR with every recipe's config-only model and one-row data file."""
    root = tmp_path_factory.mktemp("recipes")
    for _, script, name, data, _ in RECIPES.values():
        if not (root / name).exists():
            model_dir(root, script, name)
        if not (root / data).exists():
            data_file(root, data)
    return root


def dry_run(recipe: str, exp_dir, cluster: dict) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "RELAX_ENTRYPOINT_MODE"} | {"EXP_DIR": str(exp_dir)}
    return subprocess.Popen(["bash", os.path.join(ROOT, "scripts", "training", recipe), "--dry-run",
                             "--cluster", json.dumps(cluster)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_every_recipe_resolves_and_fits_its_cluster(exp_dir):
    """All five side by side (each is a second of flag checks and planning)."""
    runs = {recipe: dry_run(recipe, exp_dir, {"nodes": nodes, "gpus_per_node": 8})
            for recipe, (nodes, *_) in RECIPES.items()}
    for recipe, proc in runs.items():
        stdout, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 0, (recipe, stdout[-2000:] + stderr[-3000:])
        train = "fsdp" if "omni" in recipe else "megatron"  # (megatron takes a thinker-only Omni checkpoint)
        assert f"backends: {train} (train) / sglang (rollout)   device: gpu" in stdout, recipe
        per_node = [line for line in stdout.splitlines() if line.startswith("  node ")]
        expected = RECIPES[recipe][4]
        assert len(per_node) == len(expected), (recipe, per_node)
        for line, roles in zip(per_node, expected):
            assert "8/8   GPUs" in line and line.split("GPUs")[1].strip().startswith(roles), (recipe, line)


def test_a_recipe_on_a_cluster_too_small_names_the_node(exp_dir):
    """The same fit checks as a run: 4 Ray CPUs per node cannot hold the 8 training ranks."""
    proc = dry_run("text/run-qwen3-4B-8xgpu.sh", exp_dir, {"nodes": 1, "gpus_per_node": 8, "cpus_per_node": 4})
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 2, stdout[-2000:] + stderr[-2000:]
    assert "needs 10.5 Ray CPUs" in stderr and "has 4" in stderr, stderr[-2000:]
