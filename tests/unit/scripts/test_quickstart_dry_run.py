"""`run-tiny-cpu.sh --dry-run` prints the plan without preparing the model: no tokenizer training, no
SFT warm start, no weights (prepare.py --plan-only writes the data and the model's config.json)."""

from __future__ import annotations

import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def test_the_quickstart_dry_run_does_not_prepare_the_model(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "RELAX_ENTRYPOINT_MODE"} | {"EXP_DIR": str(tmp_path)}
    out = subprocess.run(["bash", "scripts/training/text/run-tiny-cpu.sh", "--dry-run"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "mode: colocate" in out.stdout and "roles (deploy order):" in out.stdout
    assert not (tmp_path / "models" / "tiny-qwen3-sft").exists()  # nothing trained, no weights written
    assert [p.name for p in (tmp_path / "models" / "tiny-qwen3-plan").iterdir()] == ["config.json"]
