"""Elastic rollout scaling in real runs (CPU, real roles, real `hf` engines, the run's own scaling API,
served by the Rollout role): 1 -> 3 -> 1 engines during a fully-async run and during a colocate run
(whose third engine is an external `hf` engine the test started: registered, then released, and still
running after). The colocate run has --use-fault-tolerance: the engine its first scale-out added is
killed, and the external engine is registered while the health manager replaces it (the operation waits
for the fleet lock, then runs; the replacement is unprotected, as the engine it replaced).

Each run starts with one engine; a thread beside it (elastic_helpers.ScaleDriver) scales out to three
while step 0 is held (its rewards wait on a gate file), lets the next steps run on three, then scales
in to one while the last step is held (fully async, with --max-staleness 1: step 1 may be generated on
one engine while step 0 is held; step 2 runs on three). Then: every step's samples are complete, none
lost or twice; every sample carries a weight version the staleness bound allows (colocate: exactly the
step's, so the engines that joined held the version the others had); the API refused an
unauthenticated read; the operations and the per-step metrics (`elastic/*`) tell the story; the startup
engine stayed, protected."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from elastic_helpers import ScaleDriver
from run_helpers import check_trained, reference_args, run_relax, step_rows

from relax.backends.hf.launcher import launch_hf_engine

pytestmark = pytest.mark.integration

BATCH = 16  # --rollout-batch-size 4 x --n-samples-per-prompt 4


def scaled_run(tiny_setup, exp: Path, mode: list[str], steps: int, grow: list[dict], kill_added: bool = False) -> dict:
    """`steps` steps, the last one on one engine, the ones before on three (from step 0's second half)."""
    run_dir = exp / "run"
    (exp / "custom.yaml").write_text(f"elastic_gates: {exp / 'gates'}\nelastic_batch: {BATCH}\n")
    driver = ScaleDriver(run_dir, exp / "gates", last=steps - 2, grow=grow, kill_added=kill_added)
    driver.start()
    try:
        run_relax(reference_args(tiny_setup, run_dir, num_rollout=steps, reference=False) + mode + [
            "--custom-rm-path", "tests.integration.elastic_helpers.gated_reward",
            "--custom-config-path", str(exp / "custom.yaml"), "--dump-details", str(exp / "details"),
            "--scale-in-drain-timeout", "5", "--scale-in-shutdown-timeout", "5"])
    finally:
        driver.open_gates()
        driver.join(timeout=10)
    assert driver.error is None, driver.error
    return {"run": run_dir, "details": exp / "details", "seen": driver.seen, "steps": steps}


@pytest.fixture(scope="module")
def fully_async_run(ray_cluster, tiny_setup, tmp_path_factory):
    """With an autoscaler that watches the run's real signals but never acts (thresholds out of reach),
    and a generate function that gives half the samples a prior segment (segment_generate.py: agent
    episodes that rewrote their history), trained as rows of their own; each step's batch saved."""
    exp = tmp_path_factory.mktemp("elastic_async")
    (exp / "autoscaler.yaml").write_text("min_engines: 1\nmax_engines: 3\nscale_out_threshold: 2\n"
                                         "scale_in_threshold: -1\ncooldown_s: 0\ninterval_s: 0.5\n")
    return scaled_run(tiny_setup, exp, [
        "--custom-generate-function-path", "tests.integration.segment_generate.generate",
        "--save-debug-train-data", str(exp / "train_{rollout_id}.pt"),
        "--fully-async", "--max-staleness", "1", "--autoscaler-config", str(exp / "autoscaler.yaml"),
        "--resource", '{"actor": [1, 1], "rollout": [1, 1], "actor_fwd": [1, 1], "advantages": [1, 0]}'], steps=4,
        grow=[{"target_engines": 3, "idempotency_key": "up"}])


@pytest.fixture(scope="module")
def external(tiny_setup, tmp_path_factory):
    """An hf engine someone else started (this fixture): the colocate run registers it, then releases it.
    It starts while the run deploys (registering it waits for its health check)."""
    handle = launch_hf_engine(str(tiny_setup / "model"), num_threads=1,
                              log_path=str(tmp_path_factory.mktemp("elastic_external") / "external.log"))
    try:
        yield handle
    finally:
        handle.terminate()


@pytest.fixture(scope="module")
def colocate_run(ray_cluster, tiny_setup, tmp_path_factory, external):
    """One engine launched by a scale-out (ray_native), killed and replaced in place; one registered
    (external) meanwhile."""
    return scaled_run(tiny_setup, tmp_path_factory.mktemp("elastic_colocate"), [
        "--use-fault-tolerance", "--rollout-health-check-interval", "1", "--rollout-health-check-timeout", "5"],
        steps=3, grow=[{"num_engines": 1, "idempotency_key": "up"},
                       {"addresses": [external.url.removeprefix("http://")]}], kill_added=True)


def samples(details: Path, step: int) -> list[dict]:
    return [json.loads(line) for line in (details / "rollout" / f"{step}.jsonl").read_text().splitlines()]


def check_scaled(run: dict, lag: int) -> None:
    seen, rows = run["seen"], step_rows(run["run"])
    assert seen["unauthenticated"] == 401
    assert [(e["state"], e["protected"]) for e in seen["at_3"]["engines"]] == [("active", True)] + [
        ("active", False)] * 2
    assert [(e["id"], e["protected"]) for e in seen["at_1"]["engines"]] == [("engine-0", True)]
    assert sum(len(op["engines_added"]) for op in seen["up"]) == 2 and len(seen["down"]["engines_removed"]) == 2
    assert [r["step"] for r in rows] == list(range(run["steps"]))
    check_trained(rows, single_pass=False)
    for step in range(run["steps"]):
        got = samples(run["details"], step)
        indices = [s["index"] for s in got]
        assert len(got) == BATCH and len(set(indices)) == BATCH, (step, indices)  # none lost, none twice
        assert all(s["status"] in ("completed", "truncated") for s in got), step
        versions = {v for s in got for v in s["weight_versions"]}
        assert versions and all(step - lag <= v <= step for v in versions), (step, versions)
    assert [r["elastic/engines"] for r in rows] == [3] * (run["steps"] - 1) + [1]
    assert sum(r["elastic/engines_added"] for r in rows) == 2 and sum(r["elastic/engines_removed"] for r in rows) == 2
    assert sum(r["elastic/operations"] for r in rows) == len(seen["up"]) + 1
    assert sum(r["elastic/operations_failed"] for r in rows) == 0
    events = (run["run"] / "elastic_events.jsonl").read_text()
    assert "joined the router" in events and "released" in events
    assert not (run["run"] / ".relax" / "scale_token").exists()  # removed with the run


def test_fully_async_run_scales_1_3_1_without_losing_a_sample(fully_async_run):
    check_scaled(fully_async_run, lag=1)


def test_prior_segments_train_as_rows_that_share_their_episodes_advantage(fully_async_run):
    """Through Rollout, TransferQueue, the Advantages role's streaming groups and the Actor: each odd
    sample's prior segment is one more row, with its episode's reward and advantage on its tokens."""
    import torch

    for step in range(fully_async_run["steps"]):
        batch = torch.load(fully_async_run["run"].parent / f"train_{step}.pt", weights_only=False)
        ids, episodes = batch["sample_indices"], batch["episode_indices"]
        segments = [i for i, (s, e) in enumerate(zip(ids, episodes)) if s != e]
        assert len(ids) == BATCH + len(segments) and segments, (step, ids)
        lengths = batch["response_lengths"]
        assert sorted(episodes[i] for i in segments) == sorted(
            s for s, e, n in zip(ids, episodes, lengths) if s == e and s % 2 and n // 2), step
        row = {s: i for i, s in enumerate(ids)}
        for i in segments:
            final = row[episodes[i]]
            assert batch["rewards"][i] == batch["rewards"][final]
            value = batch["advantages"][final][0]
            assert batch["advantages"][i] == pytest.approx([value * m for m in batch["loss_masks"][i]]), (step, i)


def test_the_autoscaler_decides_from_the_runs_signals_each_decision_an_event(fully_async_run):
    rows = step_rows(fully_async_run["run"])
    decisions = [json.loads(line) for line in (fully_async_run["run"] / "elastic_events.jsonl").read_text()
                 .splitlines() if json.loads(line).get("kind") == "autoscaler"]
    assert decisions and {d["action"] for d in decisions} == {"hold"} and all(d["reason"] for d in decisions)
    measured = [d["signals"] for d in decisions if d["signals"]["trainer_wait"] is not None]
    assert measured and all(0 <= s["trainer_wait"] <= 1 and s["queue_depth"] is not None for s in measured)
    assert any(s["staleness_headroom"] is not None for s in measured)
    assert sum(r["elastic/autoscaler_hold"] for r in rows) >= 1 and "time/trainer_wait" in rows[0]


def test_colocate_run_scales_1_3_1_without_losing_a_sample(colocate_run, external):
    check_scaled(colocate_run, lag=0)  # every sample of step s at version s, on old and new engines alike
    ids = [e["id"] for e in colocate_run["seen"]["at_3"]["engines"]]
    assert ids == ["engine-0", "engine-2", "external-0"]  # engine-1 (the scale-out's) was replaced by engine-2
    assert colocate_run["seen"]["down"]["engines_removed"] == [external.url, colocate_run["seen"]["at_3"][
        "engines"][1]["address"]]  # the newest first
    assert external.alive() and httpx.get(external.url + "/health", trust_env=False).status_code == 200  # released


def test_a_scaled_out_engine_is_replaced_while_a_scale_out_waits_for_the_fleet_lock(colocate_run):
    """The health manager replaced the killed engine holding the fleet lock (kept by the Rollout); the
    registration submitted meanwhile waited for it, then ran: its work began after the replacement ended."""
    seen, run = colocate_run["seen"], colocate_run["run"]
    failed = [e for e in health_events(run) if e["kind"] == "engine_failed"]
    replaced = [e for e in health_events(run) if e["kind"] == "engine_replaced"]
    assert [e["engine"] for e in failed] == [e["engine"] for e in replaced] == [seen["killed"]]
    new = replaced[0]["replacement"]
    assert [(e["address"], e["protected"]) for e in seen["at_3"]["engines"]][1] == (new, False)  # unprotected
    register = seen["up"][1]
    assert register["first_phase"] == "waiting for the fleet (an engine is being replaced)", register
    assert register["events"][0]["time"] >= replaced[0]["time"], (register["events"], replaced)
    assert step_rows(run)[-1]["health/engine_restarts"] == 1  # (cumulative)


def health_events(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "health_events.jsonl").read_text().splitlines()]
