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
    """The three scripts side by side (their preparation is most of the time; the suite's budget)."""
    runs = {}
    for script in GENERATION:
        exp = tmp_path / script
        env = {k: v for k, v in os.environ.items() if k != "RELAX_ENTRYPOINT_MODE"}  # the script sources local.sh
        env |= {"EXP_DIR": str(exp), "PREPARE_ARGS": TINY[script]}
        runs[script] = exp, subprocess.Popen(
            ["bash", os.path.join(ROOT, "scripts", "training", "agentic", script), "--dry-run"], cwd=ROOT, env=env,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for script, (exp, proc) in runs.items():
            stdout, stderr = proc.communicate(timeout=300)
            assert proc.returncode == 0, (script, stdout[-2000:] + stderr[-3000:])
            assert GENERATION[script] in stdout and "trajectories -> <outputs>/multi_turn/" in stdout, script
            assert not (exp / "run" / "summary.json").exists(), script  # a dry run trains nothing
    finally:
        for _, proc in runs.values():
            if proc.poll() is None:
                proc.kill()
