"""Real faults for the recovery tests: signals sent to a run's own processes (engines, a trainer rank,
a Serve replica), found through /proc, at moments read from what the run writes (metrics.jsonl,
health_events.jsonl), from an engine's load and from a trainer rank that stops in its backward pass
when told to. Also a reward function that hangs once, and a local endpoint Apprise posts the run's
alerts to."""

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


ARM_FILE, HELD_FILE = "hold-rank-in-backward", "rank-in-backward"  # in the run directory


def reducer_held_in_backward(mask_BT, *, per_token_loss, num_global_samples=None, num_global_tokens=None):
    """`--custom-pg-loss-reducer-function-path`: the default pg-loss reducer (the numbers stay those of
    the uninterrupted run), except that once the injector has armed it (`ARM_FILE` in the run directory)
    the first backward pass through it, in any rank and attempt of the run, stops there: the rank
    writes its pid to `HELD_FILE` and waits to be killed (mid-step, its gradients half computed)."""
    from relax.algorithms.reducers import make_reducer

    reduce = make_reducer(mask_BT, per_token_loss=per_token_loss, num_global_samples=num_global_samples,
                          num_global_tokens=num_global_tokens)
    token_file = os.environ.get("RELAX_RUN_TOKEN_FILE")  # <exp-dir>/.relax/run_token-<id>
    run = Path(token_file).parent.parent if token_file else None
    if run is None or not (run / ARM_FILE).exists():
        return reduce

    def reduce_and_hold(values_BT):
        if values_BT.requires_grad:
            values_BT.register_hook(lambda grad: _hold(run))  # runs in the backward pass
        return reduce(values_BT)

    return reduce_and_hold


def _hold(run: Path) -> None:
    try:
        fd = os.open(run / HELD_FILE, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return  # held once per run: the resumed attempt trains on
    os.write(fd, str(os.getpid()).encode())
    os.close(fd)
    time.sleep(300)  # killed here by the injector (else the step goes on and the test fails: no restart)


def held_rank(run_dir: Path) -> int | None:
    """The pid of the trainer rank held in its backward pass (`reducer_held_in_backward`), once it is."""
    try:
        return int((run_dir / HELD_FILE).read_text())
    except (OSError, ValueError):
        return None


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


# One client for every poll of the injector (which polls every 5-100 ms): `httpx.get` builds a client,
# and with it a TLS context, per call (~22 ms of CPU: 11 s over the recovery run, measured).
_CLIENT = httpx.Client(timeout=1.0, trust_env=False)


def load(url: str) -> int:
    """Requests running or queued on the engine (0 when it does not answer)."""
    try:
        info = _CLIENT.get(url + "/get_server_info").json()
    except (httpx.HTTPError, ValueError):
        return 0
    return int(info["internal_states"][0]["load"])


def weight_version(url: str) -> str | None:
    """The engine's weight version ("default" before the first push; None when it does not answer)."""
    try:
        return str(_CLIENT.get(url + "/get_weight_version").json()["weight_version"])
    except (httpx.HTTPError, ValueError, KeyError):
        return None


def process_with(needle: str, env: str | None = None, run_dir: Path | None = None) -> int | None:
    """The pid of the process whose command line (Ray's proctitle) contains `needle` and whose
    environment holds `env` (KEY=value), of the run in `run_dir` (other runs may share the machine)."""
    return next((pid for pid in _pids() if is_process(pid, needle, env, run_dir)), None)


def is_process(pid: int, needle: str, env: str | None = None, run_dir: Path | None = None) -> bool:
    """Process `pid` is one `process_with(needle, env, run_dir)` looks for."""
    if not any(needle in part for part in _cmdline(pid)):
        return False
    environ = _environ(pid)
    run = f"RELAX_RUN_TOKEN_FILE={run_dir}/".encode()  # where every role process of the run reads its token
    return (env is None or env.encode() in environ) and (run_dir is None or any(e.startswith(run) for e in environ))


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


def written_rows(path: Path) -> list[dict]:
    """The rows of a JSON-lines file the run is still writing: every complete line (a last line
    not yet ended by its newline is left out); none before the file exists."""
    try:
        lines = path.read_text().splitlines(keepends=True)
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in lines if line.endswith("\n") and line.strip()]


def rows(exp_dir: Path) -> dict[int, dict]:
    """The metrics row of each step, by step (its last row, were there several)."""
    found = {}
    for row in written_rows(exp_dir / "metrics.jsonl"):
        if "time/step" in row:
            found[row["step"]] = row
    return found


def events(exp_dir: Path, kind: str | None = None) -> list[dict]:
    return [e for e in written_rows(exp_dir / "health_events.jsonl") if kind is None or e["kind"] == kind]


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
