"""The OPD teacher's reply parsing and the engine scorer against a fake SGLang server."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from relax.components.teacher import EngineTeacher, response_logprobs
from relax.config.plan import RolePlan
from relax.config.schema import RelaxConfig


def reply(logprobs):
    return {"meta_info": {"input_token_logprobs": [[lp, i, None] for i, lp in enumerate(logprobs)]}}


def test_response_logprobs_are_the_last_response_length_entries():
    assert response_logprobs(reply([None, -1.0, -2.0, -3.0]), 2) == [-2.0, -3.0]
    assert response_logprobs(reply([None, -1.0]), 0) == []


def test_a_reply_without_input_logprobs_names_the_requirement():
    with pytest.raises(ValueError, match="logprob_start_len 0"):
        response_logprobs({"meta_info": {}}, 2)


def test_engine_teacher_sends_sglang_scoring_requests(monkeypatch):
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        import json

        body = json.loads(request.content)
        seen.append((request.url.path, body))
        return httpx.Response(200, json=[reply([None] + [-0.5 * k for k in range(1, len(ids))])
                                         for ids in body["input_ids"]])

    cfg = RelaxConfig().replace(rm_url="http://teacher:30000/generate")
    teacher = EngineTeacher(cfg, RolePlan("teacher", 0, "engine"))
    from relax.distributed.engine_client import EngineClient

    teacher.client = EngineClient("http://teacher:30000", transport=httpx.MockTransport(handler))
    out = asyncio.run(teacher.score([[1, 2, 3, 4], [5, 6, 7]], [2, 1]))
    asyncio.run(teacher.close())
    assert out == [[-1.0, -1.5], [-1.0]]
    path, body = seen[0]
    assert path == "/generate" and body["logprob_start_len"] == 0 and body["return_logprob"] is True
    assert body["sampling_params"]["max_new_tokens"] == 0 and body["input_ids"] == [[1, 2, 3, 4], [5, 6, 7]]
