"""Checkpoint commit and resume: parts are published whole, the manifest and the pointer come
last, and a resume refuses an incomplete checkpoint (naming what is missing) or, with fallback,
takes the newest complete one before it."""

from __future__ import annotations

import json

import pytest

from relax.utils import checkpoints as ck


def save_step(root, step: int, *, ranks: int = 2, critic: bool = False, commit: bool = True) -> None:
    """What the roles write for one step (a trainer part per trainer, the data position)."""
    parts = {}
    for name, directory in (("actor", root), ("critic", root / "critic")) if critic else (("actor", root),):
        final = ck.iter_dir(directory, step)
        partial = ck.stage(final)
        (partial / "model").mkdir()
        (partial / "model" / ".metadata").write_text("m")
        for r in range(ranks):
            (partial / f"rng_rank{r}.pt").write_text("rng")
        (partial / "meta.json").write_text(json.dumps({"rollout_id": step, "world_size": ranks}))
        ck.publish(partial, final)
        parts[name] = str(final)
    data = ck.data_state_path(root, step)
    data.parent.mkdir(parents=True, exist_ok=True)
    data.write_text("state")
    parts["rollout"] = str(data)
    if commit:
        ck.commit(str(root), step, parts)


def test_a_committed_checkpoint_resumes_with_all_its_parts(tmp_path):
    save_step(tmp_path, 1, critic=True)
    save_step(tmp_path, 3, critic=True)
    point = ck.resume_point(str(tmp_path))
    assert point.rollout_id == 3
    assert point.parts == {"actor": tmp_path / "iter_0000003", "critic": tmp_path / "critic" / "iter_0000003",
                           "rollout": tmp_path / "rollout" / "global_dataset_state_dict_3.pt"}
    assert (tmp_path / "critic" / ck.POINTER).read_text() == "3"
    assert json.loads((tmp_path / "iter_0000003" / ck.MANIFEST).read_text())["parts"]["actor"] == "iter_0000003"


def test_an_empty_directory_means_a_fresh_start(tmp_path):
    assert ck.resume_point(str(tmp_path)) is None


@pytest.mark.parametrize("damage, needle", [
    (lambda root: (root / "iter_0000003" / "rng_rank1.pt").unlink(), "rng_rank1.pt"),
    (lambda root: (root / "rollout" / "global_dataset_state_dict_3.pt").unlink(), "global_dataset_state_dict_3.pt"),
    (lambda root: (root / "iter_0000003" / ck.MANIFEST).unlink(), "checkpoint.json"),
    (lambda root: (root / "iter_0000003" / "model" / ".metadata").unlink(), ".metadata"),
])
def test_an_incomplete_latest_checkpoint_is_refused_or_falls_back(tmp_path, damage, needle):
    save_step(tmp_path, 1)
    save_step(tmp_path, 3)
    damage(tmp_path)
    with pytest.raises(ck.CheckpointError, match="step 3.*incomplete") as err:
        ck.resume_point(str(tmp_path))
    assert needle in str(err.value) and "--load-fallback" in str(err.value)
    assert ck.resume_point(str(tmp_path), fallback=True).rollout_id == 1


def test_a_save_that_never_committed_is_not_resumed_silently(tmp_path):
    save_step(tmp_path, 1, commit=False)  # the parts were written, the commit never happened
    with pytest.raises(ck.CheckpointError, match="no latest_checkpointed_iteration.txt"):
        ck.resume_point(str(tmp_path))
    with pytest.raises(ck.CheckpointError, match="no earlier checkpoint is complete"):
        ck.resume_point(str(tmp_path), fallback=True)


def test_a_crash_mid_save_leaves_the_previous_checkpoint_latest(tmp_path):
    save_step(tmp_path, 1)
    partial = ck.stage(ck.iter_dir(tmp_path, 3))  # step 3's actor part half written, then a crash
    (partial / "meta.json").write_text("{")
    assert ck.resume_point(str(tmp_path)).rollout_id == 1
    assert (tmp_path / ck.POINTER).read_text() == "1"


def test_prune_keeps_the_newest_and_the_one_just_written(tmp_path):
    for step in (1, 3, 5):
        save_step(tmp_path, step)
    ck.prune(tmp_path, 2, protect=5)
    assert sorted(p.name for p in tmp_path.glob("iter_*")) == ["iter_0000003", "iter_0000005"]
    assert ck.resume_point(str(tmp_path)).rollout_id == 5


# ---- --rotate-ckpt ------------------------------------------------------------------------------


@pytest.mark.parametrize("steps, keep, kept", [
    (list(range(7)), None, {2, 5, 6}),  # interval 3: steps 2 and 5 (3rd and 6th), and the latest
    (list(range(7)), 1, {5, 6}),  # --max-actor-ckpt-to-keep 1: the newest interval one
    (list(range(6)), None, {2, 5}),  # the latest is an interval one
    ([], None, set()),
])
def test_rotation_keeps_the_latest_and_the_interval_checkpoints(steps, keep, kept):
    assert ck.rotation_keeps(steps, 3, keep) == kept


def test_prune_rotated_deletes_the_intermediate_steps(tmp_path):
    for step in range(7):
        ck.iter_dir(tmp_path, step).mkdir(parents=True)
    ck.prune_rotated(tmp_path, 3, None, protect=6)
    assert sorted(p.name for p in tmp_path.iterdir()) == [ck.iter_dir(tmp_path, s).name for s in (2, 5, 6)]


def test_rotate_ckpt_needs_save_and_an_interval(base):
    from relax.config import ConfigError, parse_config

    with pytest.raises(ConfigError, match="--rotate-ckpt saves every step .* needs --save DIR and --save-interval"):
        parse_config(base + ["--rotate-ckpt", "--save", "/tmp/x"])
    assert parse_config(base + ["--rotate-ckpt", "--save", "/tmp/x", "--save-interval", "2"]).ckpt.rotate_ckpt


# ---- a frozen model's step (--ref-ckpt-step, --opd-teacher-ckpt-step) ----------------------------

def step_of(root, step: int):
    return ck.step_checkpoint(str(root), step, flag="--ref-load", step_flag="--ref-ckpt-step")


def test_a_named_step_is_its_training_part_not_the_latest(tmp_path):
    save_step(tmp_path, 1)
    save_step(tmp_path, 3)
    assert step_of(tmp_path, 1) == tmp_path / "iter_0000001"  # the pointer says 3


def test_a_missing_step_names_the_steps_there(tmp_path):
    save_step(tmp_path, 1)
    save_step(tmp_path, 3)
    with pytest.raises(ck.CheckpointError, match=r"--ref-ckpt-step 2: --ref-load .* no checkpoint of step 2 "
                                                  r"\(iter_0000002\); the steps there: 1, 3"):
        step_of(tmp_path, 2)
    with pytest.raises(ck.CheckpointError, match="the steps there: none"):
        step_of(tmp_path / "empty", 0)


def test_an_hf_directory_needs_a_checkpoint_directory_for_a_step(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ck.CheckpointError, match="is an HF model directory; a step needs a checkpoint directory"):
        step_of(tmp_path, 0)


def test_an_incomplete_or_adapter_only_step_is_refused(tmp_path):
    save_step(tmp_path, 1)
    save_step(tmp_path, 2)
    (tmp_path / "iter_0000001" / "rng_rank1.pt").unlink()
    with pytest.raises(ck.CheckpointError, match="step 1 is incomplete, missing: .*rng_rank1.pt.*steps there: 1, 2"):
        step_of(tmp_path, 1)
    meta = tmp_path / "iter_0000002" / "meta.json"
    meta.write_text(json.dumps({**json.loads(meta.read_text()), "lora": {"rank": 4}}))
    with pytest.raises(ck.CheckpointError, match="LoRA adapters only"):
        step_of(tmp_path, 2)
