"""The agentic launch scripts parse: each prepares a tiny setting (PREPARE_ARGS) and runs
`relax-train --dry-run` on its flags (the environment module imported and checked, the seeds' YAML
read, the plan printed), without starting Ray. Whether they learn is measured by hand
(docs/agentic.md "Examples")."""

from __future__ import annotations

import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
TINY = {"run-tiny-agent-cpu.sh": "--sft-tool-steps 1 --sft-steps 1 --n-train 8 --n-eval 4 --hidden-size 32 "
                                 "--num-layers 1 --vocab-size 300",
        "run-tiny-deepeyes-cpu.sh": "--sft-tool-steps 1 --sft-steps 1 --n-train 8 --n-eval 4",
        "run-blackbox-agent-cpu.sh": "--sft-tool-steps 1 --sft-steps 1 --n-train 8 --n-eval 4 --hidden-size 32 "
                                     "--num-layers 1 --vocab-size 300"}


GENERATION = {
    "run-tiny-agent-cpu.sh": "generation: multi-turn rollout, environment examples.tiny_agent.env_lookup, at most 3",
    "run-tiny-deepeyes-cpu.sh": "generation: examples.deepeyes.rollout.generate, environment "
                                "examples.deepeyes.env_deepeyes, at most 3 turns",
    "run-blackbox-agent-cpu.sh": "generation: black-box agent examples.tiny_agent.blackbox_agent.run_episode via "
                                 "the gateway on 127.0.0.1",
}


def test_the_agentic_scripts_dry_run(tmp_path):
    """The three scripts; the black-box one reuses the tiny-agent one's model directory, as its header suggests
    (MODEL_DIR: prepare.py finds them prepared with the same settings and skips), so it starts once that one has exited.
    (Their preparation is most of the time; the suite's budget.)"""
    def start(script: str, **extra: str) -> subprocess.Popen:
        env = {k: v for k, v in os.environ.items() if k != "RELAX_ENTRYPOINT_MODE"}  # the script sources local.sh
        env |= {"EXP_DIR": str(tmp_path / script), "PREPARE_ARGS": TINY[script], **extra}
        return subprocess.Popen(["bash", os.path.join(ROOT, "scripts", "training", "agentic", script), "--dry-run"],
                                cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def finish(script: str, proc: subprocess.Popen) -> str:
        stdout, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 0, (script, stdout[-2000:] + stderr[-3000:])
        assert GENERATION[script] in stdout and "trajectories -> <outputs>/multi_turn/" in stdout, script
        assert not (tmp_path / script / "run" / "summary.json").exists(), script  # a dry run trains nothing
        return stdout

    shared, blackbox = "run-tiny-agent-cpu.sh", "run-blackbox-agent-cpu.sh"
    runs = {script: start(script) for script in GENERATION if script != blackbox}
    try:
        for script, proc in runs.items():
            finish(script, proc)
        runs[blackbox] = start(blackbox, MODEL_DIR=str(tmp_path / shared))
        assert "tiny_agent already prepared" in finish(blackbox, runs[blackbox])
    finally:
        for proc in runs.values():
            if proc.poll() is None:
                proc.kill()
