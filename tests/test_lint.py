"""The code passes the project's ruff rules (pyproject.toml [tool.ruff]): style checked in the
same command that runs the tests, so CI fails on an unused import or an over-long line."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PATHS = ("relax", "tests", "bench", "scripts", "examples")


def test_ruff_clean():
    ruff = shutil.which("ruff")
    cmd = [ruff] if ruff else [sys.executable, "-m", "ruff"]
    out = subprocess.run([*cmd, "check", "--output-format", "concise", *PATHS], cwd=ROOT,
                         capture_output=True, text=True)
    assert out.returncode == 0, f"ruff found problems (fix them or run `ruff check --fix`):\n{out.stdout}{out.stderr}"


def test_test_modules_have_unique_basenames():
    """pytest imports test modules by basename (rootdir-relative, no packages): two `test_x.py` in different
    folders make the second one fail to collect ("import file mismatch") in the full run, not alone."""
    from collections import Counter

    names = Counter(p.name for p in (ROOT / "tests").rglob("test_*.py") if "__pycache__" not in p.parts)
    assert [n for n, c in names.items() if c > 1] == []
