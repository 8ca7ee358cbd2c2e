"""`genrm` reward: judge prompt, verdict parsing, the HTTP call, and the errors without a GenRM."""

from __future__ import annotations

import asyncio
from argparse import Namespace

import pytest
from reward_test_server import ScriptedRewardServer

from executors import executor_for
from relax.engine.rewards import genrm
from relax.types import Sample
from relax.utils.http_utils import close_sessions


def run(coro):
    """asyncio.run, closing this loop's pooled HTTP session afterwards."""
    async def main():
        try:
            return await coro
        finally:
            await close_sessions()

    return asyncio.run(main())


@pytest.mark.parametrize("reply, expected", [
    ("The answer matches.\nScore: 1", 1.0),
    ("**Score**: 0.25", 0.25),
    ("score: 0 ... later Score: 0.5", 0.5),
    (r"final \boxed{0.75} Score: 0", 0.75),
    ("I think it is wrong.\nIncorrect.", 0.0),
    ("Looks right\nCORRECT", 1.0),
    ("  7  ", 7.0),
])
def test_parse_verdict_reads_the_judges_score(reply, expected):
    assert genrm.parse_verdict(reply) == expected


@pytest.mark.parametrize("reply", ["", "no idea what to say here", "correct answer is 4 but the response says 5"])
def test_parse_verdict_without_a_verdict_raises_naming_the_format(reply):
    with pytest.raises(genrm.VerdictError, match="Score: X"):
        genrm.parse_verdict(reply)


def test_judge_messages_fill_the_template_from_prompt_response_and_label():
    messages = genrm.judge_messages([{"role": "user", "content": "What is 2+2?"}], "It is 4.", 4)
    assert messages[0]["role"] == "system" and messages[1]["role"] == "user"
    user = messages[1]["content"]
    assert "Question:\nWhat is 2+2?" in user and "Reference answer:\n4" in user
    assert "Response to grade:\nIt is 4." in user
    assert "Reference answer:\n(none)" in genrm.judge_messages("q", "r", None)[1]["content"]
    custom = genrm.judge_messages("q", "r", "l", "P={prompt} R={response} L={label} {{x}}")
    assert custom[1]["content"] == "P=q R=r L=l {x}"


def test_bad_template_placeholder_is_an_error_naming_the_key():
    with pytest.raises(ValueError, match="genrm_prompt_template"):
        genrm.check_template("{question} {response}")


def test_sampling_params_use_seed_defaults_and_reject_unknown_keys():
    assert genrm.sampling_params(None) == {"temperature": 0.1, "top_p": 1.0, "top_k": -1, "max_new_tokens": 4096}
    assert genrm.sampling_params({"max_response_len": 8, "temperature": 0})["max_new_tokens"] == 8
    with pytest.raises(ValueError, match="unknown key.*max_tokens"):
        genrm.sampling_params({"max_tokens": 8})


def test_score_without_a_deployed_genrm_names_the_flag():
    with pytest.raises(genrm.GenRMNotDeployedError, match="--genrm-model-path"):
        asyncio.run(genrm.score("r", "l", {}, prompt="p", judge=None))


def test_score_posts_the_rendered_prompt_and_sampling_params_to_the_judge():
    with ScriptedRewardServer([(200, {"text": "Fine.\nScore: 0.5", "meta_info": {}})]) as server:
        base = server.url.rsplit("/", 1)[0]
        judge = genrm.JudgeSpec(url=base, model_path=None, sampling=genrm.sampling_params({"max_response_len": 3}))
        assert run(genrm.score("It is 4.", "4", {}, prompt="2+2?", judge=judge)) == 0.5
    body = server.requests[0]
    assert body["sampling_params"]["max_new_tokens"] == 3
    assert body["text"].startswith("system: You are a careful") and body["text"].endswith("assistant: ")
    assert "Question:\n2+2?" in body["text"] and "Response to grade:\nIt is 4." in body["text"]


def _executor_args(**kw):
    base = dict(rm_type="genrm", custom_rm_path=None, reward_key=None, group_rm=False, rm_url=None,
                reward_timeout=5.0, reward_num_workers=1, reward_max_concurrency=4, reward_failure_value=-1.0)
    return Namespace(**(base | kw))


def test_executor_without_genrm_gives_the_failure_value_and_counts_it():
    executor = executor_for(_executor_args())
    samples = [Sample(index=0, prompt="p", response="r", label="l")]
    asyncio.run(executor.score(samples))
    assert samples[0].reward == -1.0
    assert executor.stats()["reward/failures"] == 1.0


def test_executor_routes_genrm_rows_to_the_judge_url():
    with ScriptedRewardServer([(200, {"text": "Score: 1"}), (200, {"text": "garbage"})]) as server:
        judge = genrm.judge_spec(server.url.rsplit("/", 1)[0], None, {"max_response_len": 4})
        executor = executor_for(_executor_args(), judge=judge)
        samples = [Sample(index=i, prompt="p", response="r", label="l") for i in range(2)]
        run(executor.score(samples))
    assert sorted(s.reward for s in samples) == [-1.0, 1.0]  # one parsed, one unparseable reply
    assert executor.stats()["reward/failures"] == 1.0
