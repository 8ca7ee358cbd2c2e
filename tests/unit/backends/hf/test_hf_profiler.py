"""The hf engine's /start_profile and /stop_profile (`relax.backends.hf.profiler`): SGLang's request
fields, a torch.profiler trace of the decode steps written where SGLang writes it, SGLang's refusals."""

from __future__ import annotations

import gzip
import json

import httpx
import pytest

from relax.backends.hf.profiler import ProfileRequest, plan_profile
from tests.unit.engine.agentic.agentic_helpers import EngineServer

LONG = {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True}


def test_a_request_becomes_sglang_s_trace_file_and_recording_options():
    plan = plan_profile(ProfileRequest(output_dir="/t/rollout_3", num_steps=3, profile_prefix="engine1",
                                       profile_id="p7", activities=["CPU", "MEM"]), "cpu")
    assert plan.path == "/t/rollout_3/engine1-p7-TP-0.trace.json.gz"
    assert (plan.num_steps, plan.cpu, plan.gpu, plan.memory) == (3, True, False, True)
    assert plan.with_stack and plan.record_shapes  # SGLang's defaults when the request leaves them unset
    quiet = plan_profile(ProfileRequest(with_stack=False, record_shapes=False), "cuda")
    assert (quiet.cpu, quiet.gpu, quiet.with_stack, quiet.record_shapes) == (True, True, False, False)


@pytest.mark.parametrize("fields, needle", [
    ({"profile_by_stage": True}, "profile_by_stage: the hf engine records one trace"),
    ({"start_step": 2}, "start_step"),
    ({"activities": ["RPD"]}, r"activities \['RPD'\]: the hf engine records CPU, GPU, MEM"),
    ({"activities": ["GPU"]}, "runs on cpu, so there is nothing to record; add CPU"),
])
def test_what_the_hf_engine_cannot_record_is_refused_with_the_reason(fields, needle):
    with pytest.raises(ValueError, match=needle):
        plan_profile(ProfileRequest(**fields), "cpu")


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    engine = EngineServer(str(tiny_model_dir))
    yield engine
    engine.close()


def test_the_engine_records_num_steps_decode_steps_into_a_trace_and_stops_on_its_own(server, tmp_path):
    start = {"output_dir": str(tmp_path / "rollout_1"), "num_steps": 2, "profile_prefix": "engine0",
             "profile_id": "p1", "activities": ["CPU"], "with_stack": False, "record_shapes": False}
    with httpx.Client(base_url=server.url, timeout=120) as client:
        assert client.post("/start_profile", json=start).text == "Start profiling.\n"
        again = client.post("/start_profile", json=start)
        assert again.status_code == 400 and "already in progress" in again.json()["error"]["message"]
        reply = client.post("/generate", json={"input_ids": [5, 6, 7], "sampling_params": LONG}).json()
        assert len(reply["output_ids"]) == 8
        stop = client.post("/stop_profile")  # it stopped after 2 steps: nothing left to stop
        assert stop.status_code == 400 and "not in progress" in stop.json()["error"]["message"]
    trace = json.loads(gzip.decompress((tmp_path / "rollout_1" / "engine0-p1-TP-0.trace.json.gz").read_bytes()))
    names = {e.get("name") for e in trace["traceEvents"]}
    assert any(str(n).startswith("aten::") for n in names)  # the model's ops, recorded on the decode thread


def test_stop_profile_ends_a_profile_without_num_steps_and_writes_it(server, tmp_path):
    with httpx.Client(base_url=server.url, timeout=120) as client:
        assert client.post("/start_profile", json={"output_dir": str(tmp_path), "profile_id": "whole",
                                                   "activities": ["CPU"], "with_stack": False,
                                                   "record_shapes": False}).status_code == 200
        client.post("/generate", json={"input_ids": [5, 6], "sampling_params": LONG}).raise_for_status()
        stopped = client.post("/stop_profile")
    assert stopped.status_code == 200 and "whole-TP-0.trace.json.gz" in stopped.text
    assert (tmp_path / "whole-TP-0.trace.json.gz").stat().st_size > 0


def test_a_trace_that_cannot_be_written_is_reported_and_the_engine_keeps_serving(server):
    with httpx.Client(base_url=server.url, timeout=120) as client:
        client.post("/start_profile", json={"output_dir": "/proc/no/such/dir", "activities": ["CPU"],
                                            "with_stack": False, "record_shapes": False}).raise_for_status()
        stopped = client.post("/stop_profile")
        reply = client.post("/generate", json={"input_ids": [5], "sampling_params": LONG})
    assert stopped.status_code == 400
    assert "could not be written to /proc/no/such/dir" in stopped.json()["error"]["message"]
    assert reply.status_code == 200
