"""Real faults for the recovery tests: signals sent to a run's own processes (engines, a trainer rank,
a Serve replica), found through /proc, at moments read from what the run writes (metrics.jsonl,
health_events.jsonl) and from an engine's load. Also a reward function that hangs once, and a local
endpoint Apprise posts the run's alerts to."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Callable

import httpx

from tests.alert_inbox import AlertInbox  # noqa: F401 - the recovery run's alert endpoint
from tests.integration.digit_reward import reward_func


def hang_once_reward(args, sample, **kwargs):
    """The digit reward, except that the first sample scoring 0 (any worker, any attempt of the run)
    hangs for an hour instead of returning: the executor must time it out (--reward-timeout) and give
    --reward-failure-value (0.0, the reward it would have had) and go on."""
    reward = reward_func(args, sample)
    if reward == 0.0 and getattr(args, "hang_marker", None):
        try:
            os.close(os.open(args.hang_marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return reward
        time.sleep(3600)
    return reward


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def _pids() -> list[int]:
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and int(p.name) != os.getpid()]


def engines(exp_dir: Path) -> dict[str, tuple[int, str]]:
    """Live hf engines of the run: log file name (engine_0.log, ...) -> (pid, url)."""
    found = {}
    for pid in _pids():
        cmd = _cmdline(pid)
        if "relax.backends.hf.server" not in cmd:
            continue
        try:
            log = os.readlink(f"/proc/{pid}/fd/1")
        except OSError:
            continue
        if log.startswith(str(exp_dir)) and _state(pid) != "Z":
            found[os.path.basename(log)] = (pid, f"http://127.0.0.1:{cmd[cmd.index('--port') + 1]}")
    return found


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "?"


def load(url: str) -> int:
    """Requests running or queued on the engine (0 when it does not answer)."""
    try:
        info = httpx.get(url + "/get_server_info", timeout=1.0, trust_env=False).json()
    except (httpx.HTTPError, ValueError):
        return 0
    return int(info["internal_states"][0]["load"])


def weight_version(url: str) -> str | None:
    """The engine's weight version ("default" before the first push; None when it does not answer)."""
    try:
        return str(httpx.get(url + "/get_weight_version", timeout=1.0, trust_env=False).json()["weight_version"])
    except (httpx.HTTPError, ValueError, KeyError):
        return None


def process_with(needle: str, env: str | None = None) -> int | None:
    """The pid of the process whose command line (Ray's proctitle) contains `needle` and whose
    environment holds `env` (KEY=value), if any."""
    for pid in _pids():
        if any(needle in part for part in _cmdline(pid)):
            if env is None or env.encode() in _environ(pid):
                return pid
    return None


def _environ(pid: int) -> list[bytes]:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return []


def wait_until(condition: Callable[[], object], timeout: float, poll_s: float = 0.02) -> object:
    """Poll `condition` until it returns something truthy (returned) or `timeout` seconds pass (None)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(poll_s)
    return None


def rows(exp_dir: Path) -> dict[int, dict]:
    """The last metrics row of each step (a step redone after a global restart is logged again)."""
    path = exp_dir / "metrics.jsonl"
    if not path.exists():
        return {}
    found = {}
    for line in path.read_text().splitlines():
        row = json.loads(line)
        if "time/step" in row:
            found[row["step"]] = row
    return found


def events(exp_dir: Path, kind: str | None = None) -> list[dict]:
    path = exp_dir / "health_events.jsonl"
    if not path.exists():
        return []
    found = [json.loads(line) for line in path.read_text().splitlines()]
    return [e for e in found if kind is None or e["kind"] == kind]


class Injector(threading.Thread):
    """Runs `plan(self)` beside the run; `self.did` lists what it did, `self.error` what went wrong."""

    def __init__(self, plan: Callable[["Injector"], None]) -> None:
        super().__init__(daemon=True, name="fault-injector")
        self.plan, self.did, self.error = plan, [], None

    def run(self) -> None:
        try:
            self.plan(self)
        except Exception as exc:  # noqa: BLE001 - reported by the test
            self.error = exc

    def signal(self, pid: int, sig: signal.Signals, what: str) -> None:
        os.kill(pid, sig)
        self.did.append((time.monotonic(), f"{sig.name} {what} (pid {pid})"))
