"""bench/suite_cost.py's pure parts and its pytest plugin: a test's bench group, a group's summary, and the
rows the plugin writes for the group it keeps."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from bench.suite_cost import suite_group, summarize

ROOT = Path(__file__).resolve().parents[3]


def test_the_named_xdist_groups_stay_and_every_module_group_is_units():
    assert [suite_group(g) for g in ("integration", "own_ray", "multinode", "rank_pool")] == \
        ["integration", "own_ray", "multinode", "rank_pool"]
    assert suite_group("tests/unit/config/test_plan.py") == suite_group(None) == "units"


def test_a_summary_lists_the_costliest_tests_and_kinds_of_process_first():
    rows = [{"test": "a", "wall_s": 1.0, "cpu_s": 2.0}, {"test": "b", "wall_s": 3.0, "cpu_s": 9.0},
            {"test": "c", "wall_s": 1.0, "cpu_s": 4.0}]
    kinds = {"hf engine": {"cpu_s": 4.86, "processes": 1}, "training rank": {"cpu_s": 12.54, "processes": 2},
             "ray daemons": {"cpu_s": 1.0, "processes": 3}}
    summary = summarize("units", rows, wall_s=10.0, cpu_s=15.0, top=2, by_kind=kinds)
    assert [r["test"] for r in summary["top"]] == ["b", "c"]
    assert summary["by_kind"] == [{"kind": "training rank", "cpu_s": 12.5, "processes": 2},
                                  {"kind": "hf engine", "cpu_s": 4.9, "processes": 1}]
    assert summary["tests"] == 3 and summary["cores_busy"] == 1.5


def test_the_plugin_runs_only_its_group_and_writes_a_row_per_test(tmp_path):
    out = tmp_path / "rows.json"
    env = os.environ | {"SUITE_COST_GROUP": "units", "SUITE_COST_OUT": str(out)}
    module = "tests/unit/bench/test_run_cost.py"  # (a unit module: the `units` group keeps all of its tests)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", "-p",
                           "bench.suite_cost", module], cwd=ROOT, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 16 and all(r["test"].startswith(module) and r["cpu_s"] >= 0 for r in rows)
    env["SUITE_COST_GROUP"] = "integration"  # none of the module's tests: all deselected, no row
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", "-p",
                           "bench.suite_cost", module], cwd=ROOT, env=env, capture_output=True, text=True)
    assert "16 deselected" in proc.stdout and json.loads(out.read_text())["rows"] == []


def test_the_plugin_names_the_processes_its_tests_start(tmp_path):
    """A test that starts a busy child: the child's CPU is in `by_kind` under its kind, the pytest
    process's own beside it."""
    (tmp_path / "test_busy_child.py").write_text(
        "import subprocess, sys\n\n\ndef test_child():\n"
        "    subprocess.run([sys.executable, '-m', 'busy_child_probe'], check=True, cwd=%r)\n" % str(tmp_path))
    (tmp_path / "busy_child_probe.py").write_text(
        "import time\nend = time.process_time() + 1.5\nwhile time.process_time() < end:\n    pass\n")
    out = tmp_path / "rows.json"
    env = os.environ | {"SUITE_COST_GROUP": "units", "SUITE_COST_OUT": str(out), "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", "-p",
                           "bench.suite_cost", "--rootdir", str(tmp_path), str(tmp_path / "test_busy_child.py")],
                          cwd=tmp_path, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:]
    found = json.loads(out.read_text())
    assert [r["test"].rsplit("::", 1)[1] for r in found["rows"]] == ["test_child"]
    child = found["by_kind"]["python -m busy_child_probe"]
    assert child["processes"] == 1 and child["cpu_s"] >= 1.0, found["by_kind"]
    assert found["by_kind"]["pytest (in-process tests)"]["cpu_s"] > 0
