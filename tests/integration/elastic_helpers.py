"""Drive a running run's scaling API from a thread beside it (the run itself runs in the test's main
thread), at moments the run makes certain: a reward that waits while its step's gate file exists holds
that step, so engines join and leave while a step is under way and before the run can end. With
fault tolerance on, the driver can also kill the engine its first scale-out added, so that the next
scale-out is submitted while the health manager replaces that engine (it waits for the fleet lock)."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from relax.engine.elastic.discovery import find
from tests.integration.digit_reward import reward_func
from tests.integration.fault_injection import engines, written_rows
from tests.integration.fault_injection import wait_until as poll_until


def wait_until(check, timeout: float):
    """`check()`'s first truthy value within `timeout` seconds (polled every 0.2 s), or None."""
    return poll_until(check, timeout, poll_s=0.2)


def gate(gates: Path, step: int) -> Path:
    return gates / f"step_{step}"


def gated_reward(args, sample, **kwargs):
    """The digit reward, once the gate file of the sample's step is gone (`elastic_gates` of
    --custom-config-path; a step's samples are indices [step * batch, (step + 1) * batch))."""
    held = gate(Path(args.elastic_gates), sample.index // args.elastic_batch)
    while held.exists():
        time.sleep(0.05)
    return reward_func(args, sample)


def rows(run_dir: Path) -> list[dict]:
    return written_rows(run_dir / "metrics.jsonl")


class ScaleDriver(threading.Thread):
    """1 -> 3 engines while step 0 is held; once step `last` is logged (it ran on three), -> 1 while step
    `last + 1` is held."""

    def __init__(self, run_dir: Path, gates: Path, last: int, grow: list[dict], kill_added: bool = False) -> None:
        """`grow`: the POST /scale_out bodies that take the fleet to three engines, one after the other;
        `kill_added`: after the first, its engine is killed and the next is posted while it is replaced."""
        super().__init__(daemon=True)
        self.run_dir, self.gates, self.last, self.grow, self.kill_added = run_dir, gates, last, grow, kill_added
        gates.mkdir(parents=True, exist_ok=True)
        for step in (0, last + 1):
            gate(gates, step).touch()
        self.seen: dict[str, Any] = {}
        self.error: BaseException | None = None

    def open_gates(self) -> None:
        for step in (0, self.last + 1):
            gate(self.gates, step).unlink(missing_ok=True)

    def run(self) -> None:
        try:
            self._drive()
        except BaseException as exc:  # noqa: BLE001 - the test reads it
            self.error = exc
            self.open_gates()  # let the run end

    def _drive(self) -> None:
        found = wait_until(lambda: _try_find(self.run_dir), timeout=300)
        assert found, "the run never published its scaling API"
        url, token = found
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60,
                          trust_env=False) as client:
            self.seen["unauthenticated"] = httpx.get(url + "/fleet", trust_env=False).status_code
            self.seen["up"] = [self._operation(client, "/scale_out", self.grow[0])]
            if self.kill_added:
                self._kill(self.seen["up"][0]["engines_added"][0])
            self.seen["up"] += [self._operation(client, "/scale_out", body) for body in self.grow[1:]]
            self.seen["at_3"] = client.get("/fleet").json()
            gate(self.gates, 0).unlink()  # step 0 goes on, then the next ones on three engines
            assert wait_until(lambda: any(r.get("step") == self.last for r in rows(self.run_dir)), 300), \
                f"step {self.last} never ended"
            self.seen["down"] = self._operation(client, "/scale_in", {"target_engines": 1})
            self.seen["at_1"] = client.get("/fleet").json()
            gate(self.gates, self.last + 1).unlink()  # the rest runs on one engine

    def _kill(self, url: str) -> None:
        """SIGKILL the engine at `url`; returns once its replacement is launching (its log, `.restart1`,
        exists): the health manager holds the fleet lock until the new engine holds the weights."""
        pid = next((pid for pid, u in engines(self.run_dir).values() if u == url), None)
        assert pid is not None, f"no engine process serves {url}"
        os.kill(pid, signal.SIGKILL)
        self.seen["killed"] = url
        assert wait_until(lambda: list(self.run_dir.glob("*.restart1.log")), timeout=120), \
            f"the health manager never replaced the killed engine {url}"

    def _operation(self, client: httpx.Client, path: str, body: dict) -> dict:
        resp = client.post(path, json=body)
        assert resp.status_code == 202, resp.text
        op = resp.json()["operation"]
        first_phase = client.get(f"/operations/{op['id']}").json()["operation"]["phase"]
        again = client.post(path, json=body) if "idempotency_key" in body else None
        if again is not None:  # the same key: the same operation, not a second one
            assert again.status_code == 200 and again.json()["operation"]["id"] == op["id"], again.text
        done = wait_until(lambda: (o := client.get(f"/operations/{op['id']}").json()["operation"])["status"]
                          not in ("pending", "running") and o, timeout=300)
        assert done and done["status"] == "succeeded", done
        return done | {"first_phase": first_phase}


def _try_find(run_dir: Path):
    try:
        return find(str(run_dir))
    except FileNotFoundError:
        return None
