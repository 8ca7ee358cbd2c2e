"""Every `bench/*.py` runs as the README says (`python3 bench/<name>.py`, from the repo root of a
fresh clone): each module it imports, at the top or inside a function, resolves when the script's
own directory is first on sys.path (as Python sets it for a script), after its top level ran."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SCRIPTS = sorted((ROOT / "bench").glob("*.py"))


def imported_modules(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return sorted(set(names))


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_bench_script_imports_resolve_when_run_as_a_script(script):
    check = (
        "import importlib.util, runpy, sys\n"
        f"sys.path[0] = {str(script.parent)!r}\n"  # what `python3 bench/x.py` puts first; cwd is not on the path
        f"runpy.run_path({str(script)!r}, run_name='__bench_check__')\n"
        f"missing = [m for m in {imported_modules(script)!r} if importlib.util.find_spec(m) is None]\n"
        "assert not missing, missing\n")
    out = subprocess.run([sys.executable, "-c", check], cwd="/", capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
