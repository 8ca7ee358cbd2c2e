"""--sglang-profile* (`relax.engine.rollout.profiling`): which rollout steps are profiled, the
/start_profile and /stop_profile requests every engine gets (SGLang's ProfileReq fields), and the
flags' checks. The engines are small local HTTP servers that record what they are sent; the hf
engine's answer to the same requests is tests/unit/backends/hf/test_hf_profiler.py."""

from __future__ import annotations

import asyncio
import os

import pytest
from aiohttp import web

from relax.config import ConfigError, parse_config
from relax.engine.fleet import EngineFleet, FleetSpec
from relax.engine.rollout.profiling import EngineProfiler, ProfileSpec


def spec_for(base: list[str], *flags: str) -> ProfileSpec | None:
    return ProfileSpec.from_config(parse_config(base + list(flags)))


def test_steps_list_wins_over_the_range_and_no_selection_profiles_every_step(base):
    listed = spec_for(base, "--sglang-profile", "--sglang-profile-steps", "3", "10",
                      "--sglang-profile-step-start", "0", "--sglang-profile-step-end", "20")
    assert [s for s in range(12) if listed.selects(s)] == [3, 10]
    ranged = spec_for(base, "--sglang-profile", "--sglang-profile-step-start", "2", "--sglang-profile-step-end", "4")
    assert [s for s in range(8) if ranged.selects(s)] == [2, 3, 4]  # both ends inclusive
    assert [s for s in range(5) if spec_for(base, "--sglang-profile", "--sglang-profile-step-start", "3").selects(s)
            ] == [3, 4]
    assert all(spec_for(base, "--sglang-profile").selects(s) for s in range(5))
    assert spec_for(base, "--sglang-profile-steps", "1") is None  # without --sglang-profile nothing is profiled


def test_start_payload_carries_sglang_s_fields_per_step_and_engine(base, tmp_path):
    spec = spec_for(base, "--sglang-profile", "--sglang-profile-output-dir", str(tmp_path),
                    "--sglang-profile-num-steps", "5", "--sglang-profile-activities", "CPU", "MEM",
                    "--sglang-profile-with-stack", "--sglang-profile-record-shapes")
    assert spec.start_payload(4, 1) == {
        "output_dir": str(tmp_path / "rollout_4"), "profile_prefix": "engine1", "num_steps": 5,
        "activities": ["CPU", "MEM"], "profile_by_stage": False, "with_stack": True, "record_shapes": True}
    assert spec.engine_stops  # num_steps: the engine stops on its own
    whole = spec_for(base, "--sglang-profile", "--sglang-profile-num-steps", "-1")
    assert whole.start_payload(0, 0)["num_steps"] is None and not whole.engine_stops


def test_traces_default_to_traces_experiment_sglang_trace_from_the_launch_directory(base, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    named = parse_config(base + ["--sglang-profile", "--tb-experiment-name", "exp1"])
    assert named.engine_profile.sglang_profile_output_dir == str(tmp_path / "traces" / "exp1" / "sglang_trace")
    unnamed = parse_config(base + ["--sglang-profile"])  # the run directory's name stands for the experiment
    assert unnamed.engine_profile.sglang_profile_output_dir == str(tmp_path / "traces" / "run" / "sglang_trace")


@pytest.mark.parametrize("flags, needle", [
    (["--sglang-profile-step-start", "5", "--sglang-profile-step-end", "2"], "after --sglang-profile-step-end"),
    (["--sglang-profile-num-steps", "0"], "must be >= 1 .* or -1"),
    (["--sglang-profile-activities", "TPU"], "--sglang-profile-activities TPU: the hf engine records CPU, GPU, MEM"),
    (["--sglang-profile-by-stage"], "--sglang-profile-by-stage: the hf engine runs prefill inside"),
    (["--sglang-profile-steps", "-1"], "rollout step IDs"),
])
def test_profile_flags_are_checked_for_the_engine_that_runs(base, flags, needle):
    with pytest.raises(ConfigError, match=needle):
        parse_config(base + ["--rollout-backend", "hf", "--sglang-profile", *flags])


def test_profile_flags_without_sglang_profile_get_a_note(base):
    from relax.config.inert import inert_flag_notes

    notes = inert_flag_notes(parse_config(base + ["--sglang-profile-steps", "2", "--sglang-profile-record-shapes"]))
    assert any("--sglang-profile-steps --sglang-profile-record-shapes" in n and "--sglang-profile" in n for n in notes)


async def fake_engine(received: list, name: str, refuse: bool = False) -> tuple[web.AppRunner, str]:
    """An engine that answers health checks and records its profiler requests (`refuse`: HTTP 500)."""
    async def ok(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def profile(request: web.Request) -> web.Response:
        received.append((name, request.path, await request.json() if request.can_read_body else None))
        return web.Response(status=500 if refuse else 200, text="Start profiling.\n")

    app = web.Application()
    app.router.add_get("/health", ok)
    app.router.add_post("/flush_cache", ok)
    app.router.add_post("/start_profile", profile)
    app.router.add_post("/stop_profile", profile)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"


def test_every_engine_gets_start_and_stop_in_selected_steps_and_a_refusal_is_counted(base, tmp_path):
    spec = spec_for(base, "--sglang-profile", "--sglang-profile-steps", "1", "--sglang-profile-num-steps", "-1",
                    "--sglang-profile-output-dir", str(tmp_path))

    async def scenario():
        received: list = []
        engines = [await fake_engine(received, "a"), await fake_engine(received, "b", refuse=True)]
        fleet = EngineFleet(FleetSpec(name="rollout", backend="hf", model_path="m",
                                      external=tuple(url for _, url in engines)))
        await fleet.start(0)
        try:
            profiler = EngineProfiler(spec, fleet)
            skipped = (await profiler.start(0), await profiler.stop(0))
            started, stopped = await profiler.start(1), await profiler.stop(1)
        finally:
            await fleet.stop()
            for runner, _ in engines:
                await runner.cleanup()
        return received, skipped, started, stopped

    received, skipped, started, stopped = asyncio.run(scenario())
    assert skipped == ({}, {})  # step 0 is not selected: no request at all
    starts = sorted((n, body["profile_prefix"], body["output_dir"], body["num_steps"])
                    for n, path, body in received if path == "/start_profile")
    assert starts == [("a", "engine0", os.path.join(str(tmp_path), "rollout_1"), None),
                      ("b", "engine1", os.path.join(str(tmp_path), "rollout_1"), None)]
    assert sorted(n for n, path, _ in received if path == "/stop_profile") == ["a", "b"]  # num_steps -1: stopped
    assert started == stopped == {"profile/engine_errors": 1.0}  # engine b refused: counted, the step goes on
