"""Fault injection on one real run (CPU, real processes, real signals), and what must hold after it.

The run is the session's reference run (4 colocate GRPO steps, checkpoints at steps 1 and 3) with
two engines, --use-fault-tolerance and --use-health-check, and a reward that hangs once. While it
trains it suffers, in this order:
1. during step 0's rollout: engine 0 is killed (SIGKILL) with requests running, engine 1 is stopped
   (SIGSTOP: alive, hung, its requests in flight held), and the DCS coordinator's Serve replica is
   killed;
2. the first sample whose reward is 0 hangs its reward worker;
3. once step 2 is logged (step 1 checkpointed): the Actor's trainer rank is killed (SIGKILL) mid step 3,
   in its backward pass (held there by the run's pg-loss reducer, `reducer_held_in_backward`, which
   otherwise is the default one).
Tier 1 must replace both engines (requests re-sent, the new engines given the current weights before
they are routed to), Serve must restart the coordinator and the HealthManager set it up again, the
reward executor must time out the hung sample, and tier 2 must restart the run from step 1's
checkpoint. Every step's samples must then be exactly the uninterrupted reference run's: none lost,
none twice, none different; the resumed steps must equal the reference run's; and metrics.jsonl must
hold each step once (the failed attempt's row of step 2, redone, moved to metrics.jsonl.attempt-1)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path

import pytest
from fault_injection import (ARM_FILE, AlertInbox, Injector, engines, events, held_rank, is_process, load,
                             process_with, rows, wait_until, weight_version)
from run_helpers import reference_args

from relax.config import parse_config
from relax.core.controller import _run
from relax.core.health import HealthEvents, run_with_restarts
from relax.core.service import Runtime
from relax.utils.notify import Notifier

pytestmark = pytest.mark.integration

COMPARED = ("rollout/reward_mean", "rollout/response_len_mean", "train/pg_loss", "train/grad_norm")


def inject(run_dir: Path):
    def plan(inj: Injector) -> None:
        # 1. Step 0's rollout under way (the deploy's weight push done, requests arriving): stop engine 1
        #    (its requests hang until it is found and replaced), kill the coordinator, kill engine 0.
        # (Polled gently until the rollout is near: the injector shares the driver's process and cores.)
        logs = [run_dir / "engine_0.log", run_dir / "engine_1.log"]
        assert wait_until(lambda: all(p.exists() for p in logs), timeout=180, poll_s=0.5), "no engine started"
        up = wait_until(lambda: (e := engines(run_dir)) and len(e) == 2 and e, timeout=180, poll_s=0.5)
        assert up, "the run's two engines never came up"
        (pid0, url0), (pid1, url1) = up["engine_0.log"], up["engine_1.log"]
        assert wait_until(lambda: weight_version(url0) == weight_version(url1) == "0", timeout=180, poll_s=0.1), \
            "the engines never got the run's first weights"
        busy = wait_until(lambda: load(url0), timeout=60, poll_s=0.005)
        assert busy, "engine 0 got no request"
        inj.signal(pid0, signal.SIGKILL, f"engine 0 mid-rollout, {busy} request(s) running there")
        inj.signal(pid1, signal.SIGSTOP, "engine 1 mid-rollout (hung, not dead)")
        dcs = process_with("-dcs:dcs", run_dir=run_dir)  # Ray's title: ray::ServeReplica:relax-<run>-dcs:dcs
        assert dcs, "no DCS coordinator replica process"
        inj.signal(dcs, signal.SIGKILL, "the DCS coordinator's Serve replica")
        # 3. Both engines replaced, step 1 checkpointed and step 2 logged -> the Actor's trainer rank stops in
        #    step 3's backward pass; kill it there (mid-step: tier 2 redoes steps 2 and 3).
        assert wait_until(lambda: 2 in rows(run_dir) and len(events(run_dir, "engine_replaced")) == 2,
                          timeout=300, poll_s=0.05), "step 2 never finished, or the engines were not both replaced"
        (run_dir / ARM_FILE).touch()
        held = wait_until(lambda: held_rank(run_dir), timeout=240, poll_s=0.05)
        assert held, "the Actor's trainer rank never reached step 3's backward pass"
        assert is_process(held, "ray::Trainer", env="RELAX_WORKER_GROUP=actor", run_dir=run_dir), \
            f"pid {held} is not a trainer rank of this run's actor"
        inj.signal(held, signal.SIGKILL, "the Actor's trainer rank, in step 3's backward pass")

    return Injector(plan)


@pytest.fixture(scope="module")
def faulted_run(ray_cluster, tiny_setup, reference_run, tmp_path_factory):
    exp = tmp_path_factory.mktemp("recovery")
    run_dir = exp / "run"
    (exp / "custom.yaml").write_text(f"hang_marker: {exp / 'hung'}\n")
    args = reference_args(tiny_setup, run_dir) + [
        "--resource", '{"actor": [1, 1], "rollout": [1, 2], "reference": [1, 1]}',
        "--save", str(exp / "ckpt"), "--save-interval", "2", "--dump-details", str(exp / "details"),
        "--use-fault-tolerance", "--use-health-check", "--rollout-health-check-interval", "1",
        "--rollout-health-check-timeout", "2", "--max-global-restart", "1",
        "--custom-rm-path", "tests.integration.fault_injection.hang_once_reward", "--reward-timeout", "3",
        "--custom-pg-loss-reducer-function-path", "tests.integration.fault_injection.reducer_held_in_backward",
        "--custom-config-path", str(exp / "custom.yaml")]
    inbox = AlertInbox()
    cfg = parse_config(args + ["--notify-urls", inbox.url])
    notifier = Notifier(cfg.logging.notify_urls, run_name="recovery")
    health = HealthEvents(cfg.misc.exp_dir, notifier)

    def attempt(c):
        with Runtime(c) as runtime:
            return asyncio.run(_run(c, runtime, health))

    injector = inject(run_dir)
    injector.start()
    try:
        summary = run_with_restarts(cfg, attempt, health)
    finally:
        injector.join(timeout=5)
        for pid, _ in engines(run_dir).values():  # (a stopped engine the run failed to replace)
            os.kill(pid, signal.SIGCONT)
        notifier.flush()
        inbox.close()
    for _, what in injector.did:
        print("injected:", what)
    assert injector.error is None, injector.error
    return {"exp": exp, "run": run_dir, "summary": summary, "alerts": inbox.received}


def details(root: Path, step: int) -> list[dict]:
    return [json.loads(line) for line in (root / "rollout" / f"{step}.jsonl").read_text().splitlines()]


def lost_and_twice(got: list[dict], want: list[dict]) -> tuple[list, list, list]:
    """(lost, counted twice, different) samples of a step, against the uninterrupted run's."""
    key = lambda s: s["index"]  # noqa: E731
    got_by, want_by = {key(s): s for s in got}, {key(s): s for s in want}
    lost = sorted(set(want_by) - set(got_by))
    twice = sorted(i for i in got_by if sum(key(s) == i for s in got) > 1)
    fields = ("prompt", "response", "reward", "status", "weight_versions")
    different = sorted(i for i in set(got_by) & set(want_by) if any(got_by[i][f] != want_by[i][f] for f in fields))
    return lost, twice, different


def test_every_step_has_the_uninterrupted_runs_samples(faulted_run, reference_run):
    """Whatever failed, each step trained on exactly the samples the uninterrupted run trained on."""
    for step in range(4):
        got, want = details(faulted_run["exp"] / "details", step), details(reference_run / "details", step)
        lost, twice, different = lost_and_twice(got, want)
        print(f"step {step}: {len(got)} samples; lost {lost}, counted twice {twice}, different {different}")
        assert len(got) == len(want) == 16 and not lost and not twice and not different


def test_killed_and_hung_engines_are_replaced_in_place(faulted_run):
    """SIGKILL and SIGSTOP of the two engines mid-rollout: both found (dead / no answer), replaced by
    engines holding the current weights, their requests re-sent; the step they hit completes."""
    run = faulted_run["run"]
    failed = events(run, "engine_failed")
    print("engine failures:", [e["message"][:160] for e in failed])
    assert any("died" in e["message"] for e in failed) and any("no answer" in e["message"] for e in failed)
    # The weights each replacement got: those of the step it joined in (the samples test shows every
    # sample's weight version equals the uninterrupted run's).
    replaced = events(run, "engine_replaced")
    assert len(replaced) == 2 and all(e["weight_version"] in (0, 1, 2) for e in replaced)
    last = rows(run)[3]
    print("requests re-sent:", last["health/requests_resent"], "lost: none (see the samples test)")
    assert last["health/engine_restarts"] == 2 and last["health/requests_resent"] >= 1


def test_a_crashed_role_replica_is_restarted_and_set_up_again(faulted_run):
    run = faulted_run["run"]
    assert [e["role"] for e in events(run, "role_failed")] == ["dcs"]
    assert [e["role"] for e in events(run, "role_restarted")] == ["dcs"]
    print("role restarts:", [e["message"] for e in events(run, "role_restarted")], "lost: nothing")


def test_a_hung_reward_is_timed_out_and_the_run_goes_on(faulted_run):
    timeouts = {step: row["reward/timeouts"] for step, row in rows(faulted_run["run"]).items()}
    print("reward timeouts per step:", timeouts, "lost: none (the sample scored --reward-failure-value)")
    assert sum(timeouts.values()) == 1


def step_rows(path: Path) -> list[dict]:
    return [row for row in map(json.loads, path.read_text().splitlines()) if "time/step" in row]


def test_a_trainer_rank_killed_mid_step_restarts_the_run_from_its_checkpoint(faulted_run, reference_run):
    """Tier 2: the run resumes from step 1's checkpoint and steps 2 and 3 equal the uninterrupted run's;
    metrics.jsonl holds each step once, the resumed attempt's rows; each recovery was alerted."""
    run, expected = faulted_run["run"], rows(reference_run / "run")
    restarts = events(run, "global_restart")
    print("global restarts:", [e["message"] for e in restarts])
    assert len(restarts) == 1 and "resuming from the checkpoint of step 1" in restarts[0]["message"]
    assert restarts[0]["superseded_steps"] == [2]  # the rank died in step 3: step 2 had been logged
    logged, moved = step_rows(run / "metrics.jsonl"), step_rows(run / "metrics.jsonl.attempt-1")
    print("steps in metrics.jsonl:", [r["step"] for r in logged], "moved to metrics.jsonl.attempt-1:",
          [r["step"] for r in moved])
    assert [r["step"] for r in logged] == [0, 1, 2, 3] and [r["step"] for r in moved] == [2]
    got = rows(run)
    assert got[3]["health/global_restarts"] == 1 and got[2]["health/global_restarts"] == 1  # step 2: redone
    for step in range(4):
        for key in COMPARED:
            assert got[step][key] == pytest.approx(expected[step][key], rel=1e-4, abs=1e-6), (step, key)
    for key in COMPARED:  # the step the failed attempt had done: the same numbers as the one redone
        assert moved[0][key] == pytest.approx(expected[2][key], rel=1e-4, abs=1e-6), key
    titles = [a.get("title", "") for a in faulted_run["alerts"]]
    print("alerts:", titles)
    assert any("engine replaced" in t for t in titles) and any("global restart" in t for t in titles)
    assert faulted_run["summary"] == {}  # no eval sets: the run returned normally
