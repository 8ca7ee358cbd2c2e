"""scripts/tools/inject_fault.py signals only an engine of the run it is pointed at, and only once the
run itself (not an earlier run in the same directory) reached the step."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

TOOL = Path(__file__).resolve().parents[3] / "scripts" / "tools" / "inject_fault.py"


def tool():
    spec = importlib.util.spec_from_file_location("inject_fault", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_rows_of_an_earlier_run_do_not_count(tmp_path, capsys):
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "time/step": 1.0}) + "\n" for s in range(5)))
    assert tool().main([str(tmp_path), "--at-step", "3", "--timeout", "0.3"]) == 1
    assert "step 2 was not logged" in capsys.readouterr().err


def test_only_the_runs_engine_is_signalled(tmp_path, capsys):
    """A process that is not an hf engine logging to RUN_DIR/engine_0.log is never signalled."""
    log = open(tmp_path / "engine_0.log", "w")
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], stdout=log)
    try:
        assert tool().main([str(tmp_path), "--at-step", "1", "--timeout", "0.3"]) == 1
        assert other.poll() is None and "no live engine logging to" in capsys.readouterr().err
    finally:
        other.kill()
        other.wait()
        log.close()
    assert os.path.exists(tmp_path / "engine_0.log")
