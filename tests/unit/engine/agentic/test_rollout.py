"""The multi-turn rollout in the rollout's modes: partial rollout (a turn a weight push aborts is
continued), fully async (groups streamed as they finish, versions stamped per turn), the plugin
path, and true on-policy: every response token's log-prob equal to the trainer's, bitwise."""

from __future__ import annotations

import copy
from argparse import Namespace
from collections import Counter

import agentic_envs
from agentic_helpers import Traffic, generate, generator, prompt, run

from relax.distributed.transfer_queue import row_version, samples_to_columns
from relax.engine.rollout import sglang_rollout
from relax.engine.rollout.generator import StepState
from relax.engine.specs import PartialRolloutSpec
from relax.types import Sample


def abort_call(number: int):
    """A `Traffic.rewrite` that answers call `number` as a weight push would: its tokens so far, aborted."""
    def rewrite(payload: dict, reply: dict, index: int) -> dict:
        if index != number:
            return reply
        reply = copy.deepcopy(reply)
        reply["meta_info"]["finish_reason"] = {"type": "abort", "message": "aborted by a weight update"}
        return reply
    return rewrite


def test_a_turn_aborted_by_a_weight_push_is_continued_from_its_tokens(engine, monkeypatch):
    traffic = Traffic(rewrite=abort_call(1)).install(monkeypatch)  # the second turn's first request
    gen = generator(engine, env="agentic_envs", max_turns=3,
                    partial=PartialRolloutSpec(enabled=True, mask_offpolicy=True))
    step = StepState()
    sample = run(gen.generate_one(step, prompt("what is the price of plum", 0, mode="tool")))
    (p0, _), (p1, r1), (p2, r2), (p3, _) = traffic.calls
    aborted = [int(t) for _, t, _ in r1["meta_info"]["output_token_logprobs"]]
    assert aborted and p2["input_ids"] == p1["input_ids"] + aborted  # continued, not restarted
    assert p2["sampling_params"]["max_new_tokens"] == 6 - len(aborted)  # the turn's budget left
    continued = [int(t) for _, t, _ in r2["meta_info"]["output_token_logprobs"]]
    assert sample.metadata["turns"] == 3 and sample.metadata["termination"] == "max_turns"
    assert agentic_envs.STEPS[0][1] == gen.tokenizer.decode(aborted + continued, skip_special_tokens=True)
    assert len(agentic_envs.STEPS[0]) == 3 and agentic_envs.CLOSED == [0]  # one step per turn, one env
    assert sample.abort_count == 1 and step.partial_stats["rollout/partial_aborts"] == 1
    assert len(sample.weight_versions) == 4  # one per request
    # --mask-offpolicy-in-partial-rollout: what was generated before the abort is not trained on
    before = len(p2["input_ids"]) - len(p0["input_ids"])
    assert not any(sample.loss_mask[:before]) and sample.loss_mask[before:before + len(continued)] == \
        [1] * len(continued)


def test_fully_async_streams_groups_and_stamps_each_turns_weight_version(engine):
    """Groups (their own environment per sample) reach the sink as they finish; a push landing
    between turns shows in the turns' versions, the row keeps the oldest, and true on-policy
    rescoring is skipped (those log-probs are the behaviour policy's)."""
    gen = generator(engine, env="agentic_envs", max_turns=2, n=2, true_on_policy=True)
    steps = []

    def bump() -> None:  # at the group's second step both first turns are answered: a push lands now
        steps.append(1)
        if len(steps) == 2:
            engine.engine.weight_version = "1"

    agentic_envs.HOOKS["bump"] = bump
    streamed: list[list[Sample]] = []

    class Source:
        def get_samples(self, n: int) -> list[list[Sample]]:
            return [[prompt("what is the price of plum", 2 * g + j, mode="bump") for j in range(2)] for g in range(n)]

    async def sink(group: list[Sample]) -> None:
        streamed.append(group)

    step = StepState(group_sink=sink)
    try:
        groups = run(gen.rollout(step, 0, Source()))
    finally:
        engine.engine.weight_version = "default"
    assert streamed == groups and [len(g) for g in groups] == [2]
    samples = groups[0]
    assert sorted(agentic_envs.CLOSED) == [0, 1]
    for s in samples:
        assert s.weight_versions[0] == 0 and s.weight_versions[-1] == 1 and row_version(s, started_at=0) == 0
        assert s.metadata["rescored"] is False
    columns = samples_to_columns(samples, [0.0, 1.0], started_at=0)
    assert columns["weight_versions"].tolist() == [0, 0]


def test_the_plugin_path_runs_the_configured_environment(engine):
    """`--custom-generate-function-path relax.engine.agentic.generate` with the env from the config."""
    args = Namespace()
    gen = generator(engine, env="agentic_envs", max_turns=2, custom="relax.engine.agentic.generate", args=args)
    sglang_rollout.bind(args, gen)
    sample = generate(gen, [prompt("what is the price of fig", 0, mode="tool")])[0]
    assert sample.metadata["turns"] == 2 and agentic_envs.CLOSED == [0]


def test_true_on_policy_multi_turn_log_probs_equal_the_trainers_bitwise(engine, trainer, monkeypatch):
    """Every response token of multi-turn samples (model turns and observations; a GRPO group; one
    sample resumed after an abort): the engine's log-prob == the trainer's, 0 of N differ."""
    Traffic(rewrite=abort_call(1)).install(monkeypatch)
    gen = generator(engine, env="agentic_envs", max_turns=4, n=3, true_on_policy=True,
                    partial=PartialRolloutSpec(enabled=True))
    samples = [prompt("what is the price of plum" + " fig" * (i // 3), i, mode="tool") for i in range(9)]
    done = generate(gen, samples)
    assert all(s.metadata["rescored"] for s in done) and sum(s.abort_count for s in done) == 1
    scored = trainer.compute_log_probs([s.tokens for s in done], [s.response_length for s in done])
    differ = Counter(a != b for s, row in zip(done, scored) for a, b in zip(s.rollout_log_probs, row))
    assert differ[True] == 0 and differ[False] == sum(s.response_length for s in done) > 500
