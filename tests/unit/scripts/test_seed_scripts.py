"""The seeds' example scripts run as written (issue 34): the customization guide's Qwen3-VL script and
the verl-to-Relax guide's launch script, as tiny-model copies in tests/unit/scripts/seed_scripts/, and
examples/gsm8k/run_gsm8k.sh, each in its modes on the fsdp and the megatron backend.

Each runs as a user runs it (bash, its environment knobs, `--train-backend B --dry-run` appended): the
plan is printed and the process exits 0 before Ray starts. Nothing trains and no model is built: the
first run of each script starts from an empty directory and prepares what its dry run reads (the tiny
model's config.json, the data); the other runs reuse that directory, all of them side by side."""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
SEEDS = os.path.join("tests", "unit", "scripts", "seed_scripts")
VL = os.path.join(SEEDS, "qwen3-vl-customization-tiny.sh")
VERL = os.path.join(SEEDS, "verl-guide-launch-tiny.sh")
GSM8K = os.path.join("examples", "gsm8k", "run_gsm8k.sh")
BACKENDS = ("fsdp", "megatron")
SYNC_ROLES = ["actor", "rollout", "reference", "dcs"]
ASYNC_ROLES = ["actor", "rollout", "reference", "actor_fwd", "advantages", "dcs"]

pytestmark = pytest.mark.xdist_group("seed_scripts")  # one worker runs the module's shared dry runs


@dataclass(frozen=True)
class Run:
    script: str
    label: str
    mode: str | None   # the script's mode argument (None: it has none)
    backend: str
    plan_mode: str     # the plan's `mode:` line
    roles: list[str]   # the plan's roles in deploy order (TransferQueue aside)
    lines: tuple[str, ...] = ()  # plan lines the seed's flags make

    @property
    def name(self) -> str:
        return "-".join(p for p in (self.label, self.mode, self.backend) if p)


def _runs() -> list[Run]:
    runs = [Run(VL, "qwen3-vl", None, b, "colocate", ["metrics", "actor", "rollout", "dcs"]) for b in BACKENDS]
    for b in BACKENDS:
        flash = ("--attention-backend flash: attention is PyTorch SDPA",) if b == "megatron" else ()
        runs += [Run(VERL, "verl-guide", "sync", b, "colocate", ["metrics", *SYNC_ROLES],
                     ("--max-staleness 1: colocate mode is on-policy", *flash)),
                 Run(VERL, "verl-guide", "async", b, "fully_async", ["metrics", *ASYNC_ROLES],
                     ("staleness: rollout runs at most 3 weight version(s) ahead", *flash)),
                 Run(GSM8K, "run-gsm8k", "sync", b, "colocate", SYNC_ROLES),
                 Run(GSM8K, "run-gsm8k", "async", b, "fully_async", ASYNC_ROLES,
                     ("staleness: rollout runs at most 2 weight version(s) ahead",))]
    return runs


RUNS = _runs()
FIRST = ("qwen3-vl-fsdp", "verl-guide-sync-fsdp", "run-gsm8k-sync-fsdp")  # each script's run from nothing


def start(run: Run, tmp, first: bool) -> subprocess.Popen:
    """The script as a user runs it. Its first run prepares `tmp/<script>` (EXP_DIR); the later ones
    read it (run_gsm8k.sh rewrites its data each run: it gets an EXP_DIR of its own, the model shared)."""
    shared = tmp / os.path.basename(run.script)
    env = {k: v for k, v in os.environ.items() if k != "RELAX_ENTRYPOINT_MODE"} | {"EXP_DIR": str(shared)}
    if run.script == GSM8K and not first:
        env |= {"EXP_DIR": str(tmp / run.name), "MODEL_DIR": str(shared)}
    argv = ["bash", run.script, *([run.mode] if run.mode else []), "--train-backend", run.backend, "--dry-run"]
    return subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(procs: dict[str, subprocess.Popen]) -> dict[str, tuple[int, str, str]]:
    """name -> (exit status, stdout, stderr)."""
    results = {}
    for name, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=300)
        results[name] = (proc.returncode, stdout, stderr)
    return results


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("seed_scripts")


@pytest.fixture(scope="module")
def dry_runs(tiny_dir) -> dict[str, tuple[int, str, str]]:
    """Every run's (exit status, stdout, stderr); the first run of each script before the rest."""
    by_name = {run.name: run for run in RUNS}
    results = finish({name: start(by_name[name], tiny_dir, first=True) for name in FIRST})
    return results | finish({run.name: start(run, tiny_dir, first=False) for run in RUNS if run.name not in results})


def plan_roles(stdout: str) -> list[str]:
    """The role names of the plan's `roles (deploy order):` table."""
    table = stdout.split("roles (deploy order):\n", 1)[1].split("  TransferQueue", 1)[0]
    return [line.split()[0] for line in table.splitlines()[1:] if line.strip()]


@pytest.mark.parametrize("run", RUNS, ids=lambda r: r.name)
def test_seed_script_dry_run_prints_its_plan(dry_runs, run):
    code, stdout, stderr = dry_runs[run.name]
    assert code == 0, (run.name, stdout[-2000:] + stderr[-3000:])
    assert re.search(rf"^mode: {run.plan_mode} +backends: {run.backend} \(train\)", stdout, re.M), stdout[:500]
    assert plan_roles(stdout) == run.roles, stdout
    for line in run.lines:
        assert line in stdout, (run.name, line)
    assert "started a local Ray" not in stderr  # the dry run exits before Ray starts


def test_a_dry_run_from_nothing_builds_no_model(dry_runs, tiny_dir):
    """The first run of each script found no model: it wrote the config.json a plan reads, no weights
    (and no trained tiny-*-sft directory beside it)."""
    for script, plan in ((VL, "tiny-vl-plan"), (VERL, "tiny-qwen3-plan"), (GSM8K, "tiny-qwen3-plan")):
        models = tiny_dir / os.path.basename(script) / "models"
        assert [p.name for p in models.iterdir()] == [plan], script
        assert [p.name for p in (models / plan).iterdir()] == ["config.json"], script
