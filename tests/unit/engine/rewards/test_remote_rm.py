import asyncio

import pytest
from reward_test_server import ScriptedRewardServer

from relax.engine.rewards import grade, remote_rm


def test_posts_prompt_response_label_metadata_and_reads_a_float():
    with ScriptedRewardServer([(200, 0.75)]) as server:
        score = asyncio.run(remote_rm.score("resp", "lab", {"k": 1}, prompt="p", url=server.url, timeout=5))
    assert score == 0.75
    assert server.requests == [{"prompt": "p", "response": "resp", "label": "lab", "metadata": {"k": 1}}]


def test_reads_score_from_an_object_reply():
    with ScriptedRewardServer([(200, {"score": 1, "why": "ok"})]) as server:
        assert asyncio.run(remote_rm.score("r", "l", url=server.url, timeout=5)) == 1.0


def test_retries_after_a_500_then_succeeds():
    with ScriptedRewardServer([(500, "busy"), (200, {"score": 0.5})]) as server:
        score = asyncio.run(remote_rm.score("r", "l", url=server.url, timeout=5, backoff=0.01))
    assert score == 0.5
    assert len(server.requests) == 2


def test_gives_up_after_max_retries():
    with ScriptedRewardServer([(503, "down")]) as server:
        with pytest.raises(remote_rm.RemoteRewardError, match="after 3 attempt"):
            asyncio.run(remote_rm.score("r", "l", url=server.url, timeout=5, max_retries=2, backoff=0.01))
    assert len(server.requests) == 3


def test_client_errors_are_not_retried():
    with ScriptedRewardServer([(400, "bad request")]) as server:
        with pytest.raises(remote_rm.RemoteRewardError, match="HTTP 400"):
            asyncio.run(remote_rm.score("r", "l", url=server.url, timeout=5, backoff=0.01))
    assert len(server.requests) == 1


def test_unreadable_reply_raises():
    with ScriptedRewardServer([(200, "not a number")]) as server:
        with pytest.raises(remote_rm.RemoteRewardError, match="expected a number"):
            asyncio.run(remote_rm.score("r", "l", url=server.url, timeout=5))


def test_connection_refused_is_retried_then_fails():
    with ScriptedRewardServer([(200, 1.0)]) as server:
        url = server.url
    with pytest.raises(remote_rm.RemoteRewardError, match="ConnectError"):
        asyncio.run(remote_rm.score("r", "l", url=url, timeout=5, max_retries=1, backoff=0.01))


def test_missing_url_names_the_flag():
    with pytest.raises(ValueError, match="--rm-url"):
        asyncio.run(remote_rm.score("r", "l"))


def test_grade_runs_remote_rm_synchronously():
    with ScriptedRewardServer([(200, 0.25)]) as server:
        assert grade("remote_rm", "r", "l", {}, prompt="p", rm_url=server.url, timeout=5) == 0.25
