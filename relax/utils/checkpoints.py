"""A run's checkpoints: their layout, an atomic commit, and the completeness check on resume.

    {save}/iter_{N:07d}/                      the actor's part: model/ (DCP), rng_rank{r}.pt, meta.json
    {save}/rollout/global_dataset_state_dict_{N}.pt    the rollout's data position
    {save}/critic/iter_{N:07d}/               the critic's part (PPO; or under --critic-save)
    {save}/iter_{N:07d}/checkpoint.json       the manifest: every part, written once all exist
    {save}/latest_checkpointed_iteration.txt  the pointer, written last

Every part is written under a temporary name and renamed into place (`stage` / `publish`); the
Controller then writes the manifest and, last, the pointer (`commit`). A crash at any moment
leaves either the previous checkpoint as the latest or the new one complete. On resume,
`resume_point` checks the checkpoint the pointer names (and finds one that lost its pointer):
an incomplete one is refused with what is missing, or, with --load-fallback, the newest complete
one before it is used. A resumed run never restarts its data silently. A frozen model taken from a
run's checkpoint (--ref-load with --ref-ckpt-step, --opd-teacher-load with --opd-teacher-ckpt-step)
names its step: `step_checkpoint` checks that step's training part the same way.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

POINTER = "latest_checkpointed_iteration.txt"
MANIFEST = "checkpoint.json"
PARTIAL_SUFFIX = ".partial"
ITER_RE = re.compile(r"^iter_(\d{7})$")


class CheckpointError(ValueError):
    """A checkpoint under --load that cannot be resumed from (names what is missing and the fix)."""


def iter_dir(directory: str | Path, rollout_id: int) -> Path:
    return Path(directory) / f"iter_{rollout_id:07d}"


def data_state_path(directory: str | Path, rollout_id: int) -> Path:
    return Path(directory) / "rollout" / f"global_dataset_state_dict_{rollout_id}.pt"


def write_atomic(path: str | Path, text: str) -> None:
    """Write `path` so a reader sees the old content or the new one, never a torn file."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


# ---- saving ----------------------------------------------------------------------------------

def stage(final: Path) -> Path:
    """A fresh temporary directory to write the part `final` into (see `publish`)."""
    partial = final.with_name(final.name + PARTIAL_SUFFIX)
    shutil.rmtree(partial, ignore_errors=True)  # left by a crash mid-save
    partial.mkdir(parents=True)
    return partial


def publish(partial: Path, final: Path) -> None:
    """Move a fully written part into place (replacing an older part of the same step)."""
    if final.exists():
        shutil.rmtree(final)
    os.replace(partial, final)


def commit(save_dir: str, rollout_id: int, parts: dict[str, str]) -> None:
    """Record step `rollout_id`'s checkpoint as complete: the manifest of its `parts` (name ->
    path), the critic directory's own pointer, then the run's pointer."""
    save = Path(save_dir)
    manifest = {"rollout_id": rollout_id, "time": time.time(),
                "parts": {name: _relative(path, save) for name, path in parts.items()}}
    iter_dir(save, rollout_id).mkdir(parents=True, exist_ok=True)  # (no actor part: rollout-only runs)
    write_atomic(iter_dir(save, rollout_id) / MANIFEST, json.dumps(manifest, indent=1))
    if "critic" in parts:  # --critic-load may name the critic directory on its own
        write_atomic(Path(parts["critic"]).parent / POINTER, str(rollout_id))
    write_atomic(save / POINTER, str(rollout_id))


def prune(directory: str | Path, keep: int | None, *, protect: int) -> None:
    """Keep the newest `keep` step directories under `directory` (never step `protect`)."""
    if not keep:
        return
    steps = sorted(_iter_ids(Path(directory)))
    for step in steps[:-keep]:
        if step != protect:
            shutil.rmtree(iter_dir(directory, step), ignore_errors=True)


def rotation_keeps(steps: list[int], interval: int, keep: int | None) -> set[int]:
    """`--rotate-ckpt` (Relax's rotation): a checkpoint every step, of which the newest stays (the
    rolling one to resume from) with the `--save-interval` ones, the newest `keep` of those
    (`--max-actor-ckpt-to-keep`; all when unset). Step s is an interval one when (s + 1) % interval
    == 0 (the steps a run without rotation saves)."""
    if not steps:
        return set()
    aligned = sorted((s for s in steps if (s + 1) % interval == 0), reverse=True)
    return {max(steps), *(aligned if keep is None else aligned[:keep])}


def prune_rotated(directory: str | Path, interval: int, keep: int | None, *, protect: int) -> None:
    """Delete the step directories under `directory` that `rotation_keeps` does not keep (never `protect`)."""
    steps = _iter_ids(Path(directory))
    kept = rotation_keeps(steps, interval, keep) | {protect}
    for step in steps:
        if step not in kept:
            shutil.rmtree(iter_dir(directory, step), ignore_errors=True)


def _relative(path: str, root: Path) -> str:
    p = Path(path).resolve()
    try:
        return str(p.relative_to(root.resolve()))
    except ValueError:
        return str(p)


def _iter_ids(directory: Path) -> list[int]:
    if not directory.is_dir():
        return []
    return [int(m.group(1)) for name in os.listdir(directory) if (m := ITER_RE.match(name))]


# ---- resuming --------------------------------------------------------------------------------

def trainer_part_missing(path: Path) -> list[str]:
    """What a training-backend checkpoint directory lacks: meta.json, the model shards' index,
    one RNG file per rank that saved it (fsdp); one file per rank (megatron)."""
    if not path.is_dir():
        return [str(path)]
    meta_path = path / "meta.json"
    if not meta_path.is_file():
        return [str(meta_path)]
    missing = []
    meta = json.loads(meta_path.read_text())
    if meta.get("backend") == "megatron":  # one file per rank: model, optimizer and RNG state
        saved = len(list((path / "model").glob("tp*_dp*.pt")))
        world = int(meta.get("world_size", 1))
        return [] if saved == world else [f"{path / 'model'}: {world - saved} of {world} rank files (tp*_dp*.pt)"]
    if not (path / "model" / ".metadata").is_file():
        missing.append(str(path / "model" / ".metadata"))
    missing += [str(path / f"rng_rank{r}.pt") for r in range(int(meta.get("world_size", 1)))
                if not (path / f"rng_rank{r}.pt").is_file()]
    return missing


def checkpoint_missing(load_dir: str | Path, rollout_id: int) -> list[str]:
    """Everything step `rollout_id`'s checkpoint under `load_dir` lacks (empty: complete)."""
    root = Path(load_dir)
    manifest_path = iter_dir(root, rollout_id) / MANIFEST
    if not manifest_path.is_file():
        return [f"{manifest_path} (written once every part is saved)"]
    parts = json.loads(manifest_path.read_text())["parts"]
    missing: list[str] = []
    for name, rel in parts.items():
        path = root / rel  # (an absolute rel stays absolute)
        if name in ("actor", "critic"):
            missing += trainer_part_missing(path)
        elif not path.exists():
            missing.append(str(path))
    return missing


@dataclass(frozen=True)
class ResumePoint:
    rollout_id: int
    parts: dict[str, Path]  # part name -> where it is


def resume_point(load_dir: str, *, fallback: bool = False) -> ResumePoint | None:
    """The checkpoint to resume from under `load_dir` (None: it holds none, start fresh).

    Raises CheckpointError when the latest checkpoint is incomplete, unless `fallback`, which
    takes the newest complete one before it (and raises when there is none)."""
    root = Path(load_dir)
    pointer = root / POINTER
    steps = sorted(_iter_ids(root), reverse=True)
    if pointer.is_file():
        text = pointer.read_text().strip()
        if not text.isdigit():
            raise CheckpointError(f"--load {load_dir}: {pointer} holds {text!r}, not a step number")
        latest = int(text)
        problem = checkpoint_missing(root, latest)
        if not problem:
            return _point(root, latest)
        what = f"the latest checkpoint (step {latest}) is incomplete, missing: {', '.join(problem)}"
        candidates = [s for s in steps if s < latest]
    elif steps:
        what = (f"it holds {', '.join(f'iter_{s:07d}' for s in steps)} but no {POINTER} "
                "(a save did not finish)")
        candidates = steps
    else:
        return None
    if not fallback:
        raise CheckpointError(f"--load {load_dir}: {what}. Resume from the newest complete checkpoint "
                              "before it with --load-fallback, or point --load elsewhere")
    for step in candidates:
        if not checkpoint_missing(root, step):
            return _point(root, step)
    raise CheckpointError(f"--load {load_dir}: {what}, and no earlier checkpoint is complete; "
                          "point --load elsewhere or remove it to start fresh")


def _point(root: Path, rollout_id: int) -> ResumePoint:
    parts = json.loads((iter_dir(root, rollout_id) / MANIFEST).read_text())["parts"]
    return ResumePoint(rollout_id, {name: root / rel for name, rel in parts.items()})


def step_checkpoint(directory: str, step: int, *, flag: str, step_flag: str) -> Path:
    """The training part of step `step`'s checkpoint under `directory`, whose weights a frozen model
    loads (`flag` with `step_flag`: --ref-load with --ref-ckpt-step, ...). Raises CheckpointError
    for an HF directory (a step needs a checkpoint directory), a step not there (naming the steps
    that are), an incomplete step, or one that holds LoRA adapters only."""
    root = Path(directory)
    where = f"{step_flag} {step}: {flag} {directory}"
    if (root / "config.json").is_file():
        raise CheckpointError(f"{where} is an HF model directory; a step needs a checkpoint directory "
                              f"(iter_XXXXXXX subdirectories, as --save writes): point {flag} at one, or drop "
                              f"{step_flag} to load the HF model")
    steps = sorted(_iter_ids(root))
    held = ", ".join(map(str, steps)) if steps else "none"
    if step not in steps:
        raise CheckpointError(f"{where} has no checkpoint of step {step} (iter_{step:07d}); the steps there: {held}")
    path = iter_dir(root, step)
    missing = trainer_part_missing(path)
    if missing:
        raise CheckpointError(f"{where}: step {step} is incomplete, missing: {', '.join(missing)}; pick another "
                              f"step (the steps there: {held})")
    if json.loads((path / "meta.json").read_text()).get("lora"):
        raise CheckpointError(f"{where}: step {step} holds LoRA adapters only (a --lora-rank run); a frozen model "
                              "needs a full model's checkpoint (export the merged model with --save-hf and load that)")
    return path
