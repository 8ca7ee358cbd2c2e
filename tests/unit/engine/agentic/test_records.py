"""Per-step multi-turn metrics, the --turn-reward rule and the --log-multi-turn trajectory log."""

from __future__ import annotations

import json

import pytest
from agentic_helpers import generate, generator, prompt

from relax.engine.agentic.records import add_turn_rewards, log_trajectories, multi_turn_metrics
from relax.types import Sample


def episode(index: int, termination: str, turns: int, tool_calls: int, turn_rewards=(), reward=1.0) -> Sample:
    return Sample(index=index, reward=reward, metadata={"termination": termination, "turns": turns,
                                                         "tool_calls": tool_calls,
                                                         "turn_rewards": list(turn_rewards)})


def test_metrics_count_turns_tool_calls_terminations_and_env_errors():
    samples = [episode(0, "env_done", 2, 1, [0.5]), episode(1, "max_turns", 4, 3, [0.5, -1.0]),
               episode(2, "env_timeout", 1, 0), episode(3, "env_done", 1, 0), Sample(index=4)]  # 4: single-turn
    m = multi_turn_metrics(samples, "eval/tools")
    assert m["eval/tools/multi_turn/turns_mean"] == 2.0 and m["eval/tools/multi_turn/tool_calls_per_sample"] == 1.0
    assert m["eval/tools/multi_turn/tool_call_rate"] == 0.5 and m["eval/tools/multi_turn/env_errors"] == 1.0
    assert m["eval/tools/multi_turn/turn_reward_mean"] == pytest.approx(0.0)  # 0.5 and -0.5
    assert {k.rsplit("/", 1)[1]: v for k, v in m.items() if "/termination/" in k} == {
        "env_done": 0.5, "max_turns": 0.25, "token_budget": 0.0, "stop": 0.0, "env_error": 0.0, "env_timeout": 0.25}
    assert multi_turn_metrics([Sample(index=0)], "rollout") == {}  # no episode: no multi-turn metrics


def test_turn_rewards_join_the_score_only_with_sum():
    final, summed, keyed = episode(0, "env_done", 2, 1, [0.5, 0.25]), episode(1, "env_done", 2, 1, [0.5]), \
        episode(2, "env_done", 1, 0, [1.0], reward={"score": 0.0, "acc": 0.0})
    add_turn_rewards([final], "final", None)
    add_turn_rewards([summed], "sum", None)
    add_turn_rewards([keyed], "sum", "score")
    assert final.reward == 1.0 and summed.reward == 1.5 and keyed.reward == {"score": 1.0, "acc": 0.0}


def test_log_multi_turn_writes_every_trajectory_and_a_text_sample(engine, tmp_path):
    gen = generator(engine, env="agentic_envs", max_turns=2, log_trajectories=True)
    done = generate(gen, [prompt("what is the price of plum", i, mode="tool") for i in range(3)])
    for s in done:
        s.reward = 0.0
    out = log_trajectories(str(tmp_path), "rollout_7", done, "rollout")
    rows = [json.loads(line) for line in (tmp_path / "multi_turn" / "rollout_7.jsonl").read_text().splitlines()]
    assert [r["index"] for r in rows] == [0, 1, 2]
    row = rows[0]
    assert row["termination"] == "max_turns" and row["turns"] == 2 and row["tool_calls"] == 2
    assert [t["role"] for t in row["trajectory"]] == ["reset", "assistant", "tool", "assistant"]
    assert row["trajectory"][2]["text"] == "result 1" and row["trajectory"][2]["info"]["reward"] == 0.5
    assert row["trajectory"][1]["tokens"] + row["trajectory"][2]["tokens"] + row["trajectory"][3]["tokens"] == \
        done[0].response_length
    text = out["text/rollout/multi_turn/trajectories"]
    assert text.count("termination max_turns") == 2 and "result 1" in text  # two samples shown
    assert log_trajectories(str(tmp_path), "rollout_8", [Sample(index=0)], "rollout") == {}
