"""describe_process: what an engine error says of the engine's process, read from a real child
process: running but silent, stopped (SIGSTOP), killed (and by what), exited (with its code)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from relax.utils.proc import ChildServer, describe_process, process_state


def _child(code: str = "import time; time.sleep(60)") -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code])


def _wait_state(proc: subprocess.Popen, needle: str) -> str:
    for _ in range(100):
        state = process_state(proc)
        if needle in state:
            return state
        time.sleep(0.05)
    return state


def test_states_of_a_real_child(tmp_path):
    log = tmp_path / "engine.log"
    log.write_text("line 1\nTraceback: something broke\n")
    proc = _child()
    try:
        assert process_state(proc) == "is running but did not answer"
        proc.send_signal(signal.SIGSTOP)
        assert "is stopped" in _wait_state(proc, "stopped")
        proc.send_signal(signal.SIGCONT)
        proc.kill()
        proc.wait()
        text = describe_process("hf", proc, "http://127.0.0.1:1", str(log))
    finally:
        proc.kill()
    assert text.startswith(f"hf engine pid {proc.pid} at http://127.0.0.1:1 was killed by SIGKILL; log {log}")
    assert text.endswith("Traceback: something broke")

    exited = _child("import sys; sys.exit(3)")
    exited.wait()
    assert process_state(exited) == "exited with code 3"
    assert "<cannot read" in describe_process("hf", exited, "u", str(tmp_path / "missing.log"))


def test_a_servers_temp_log_goes_with_a_clean_exit_and_stays_after_a_failure(tmp_path):
    """`temp_log` (a launch given no log path): removed by `terminate` once the server exited 0, kept
    when it failed (its errors name the file)."""
    outcomes = {}
    for name, code in (("clean", 0), ("failed", 3)):
        log = tmp_path / f"{name}.log"
        log.write_text("engine output\n")
        process = subprocess.Popen([sys.executable, "-c", f"raise SystemExit({code})"])
        server = ChildServer(process, "http://x", str(log))
        server.temp_log = True
        server.process.wait(timeout=30)
        outcomes[name] = (server.terminate(), log.exists())
    stopped = tmp_path / "stopped.log"  # a server stopped by SIGTERM (uvicorn exits with its code)
    stopped.write_text("engine output\n")
    server = ChildServer(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]), "http://x",
                         str(stopped))
    server.temp_log = True
    outcomes["stopped"] = (server.terminate(), stopped.exists())
    kept = tmp_path / "kept.log"
    kept.write_text("a run's engine log\n")
    server = ChildServer(subprocess.Popen([sys.executable, "-c", "pass"]), "http://x", str(kept))  # not temp_log
    server.terminate()
    assert outcomes == {"clean": (0, False), "failed": (3, True), "stopped": (-signal.SIGTERM, False)}
    assert kept.exists()
