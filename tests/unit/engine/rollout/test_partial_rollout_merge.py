"""Partial rollout: aborted samples are resumed from their partial response on the new weights.

The engine is a fake: `FakeRouter` stands in for the router's `/generate` (it records every
payload and answers from a script), so the resume/merge logic is checked token by token.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any, Callable

import pytest

from relax.config import parse_config
from relax.distributed.transfer_queue import row_version, samples_to_columns
from relax.engine.rollout import generator as generator_module
from relax.engine.rollout.generator import Generator, StepState, sample_seed
from relax.engine.rollout.partial_rollout import partial_metrics, record_abort, resume_request, resume_until_done
from relax.engine.specs import PartialRolloutSpec, RolloutSpec
from relax.types import Sample

PROMPT = "ab"
PROMPT_IDS = [ord("a"), ord("b")]


def reply(n: int, finish: str, version: int, first_token: int = 1000) -> dict[str, Any]:
    """One SGLang /generate reply: `n` new tokens, each with log-prob -0.5."""
    return {"text": "".join(chr(65 + (first_token + j) % 26) for j in range(n)),
            "meta_info": {"output_token_logprobs": [[-0.5, first_token + j, None] for j in range(n)],
                          "finish_reason": {"type": finish}, "weight_version": str(version)}}


class FakeRouter:
    """Fake `/generate`: `answer(input_ids, params)` makes each item's reply; payloads are kept."""

    def __init__(self, answer: Callable[[list[int], dict], dict]) -> None:
        self.answer = answer
        self.payloads: list[dict] = []

    @classmethod
    def scripted(cls, replies: list[dict]) -> FakeRouter:
        queue = list(replies)
        return cls(lambda ids, params: queue.pop(0))

    async def __call__(self, url: str, payload: dict, *, timeout: float | None = None) -> Any:
        self.payloads.append(payload)
        if payload["input_ids"] and isinstance(payload["input_ids"][0], list):
            return [self.answer(ids, p) for ids, p in zip(payload["input_ids"], payload["sampling_params"])]
        return self.answer(payload["input_ids"], payload["sampling_params"])


class FakeTokenizer:
    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join(chr(65 + i % 26) for i in ids)


class FakeRewards:
    async def score(self, group: list[Sample]) -> None:
        for s in group:
            s.reward = 1.0


class FakeDataSource:
    def __init__(self, prompts: list[str]) -> None:
        self.groups = [[Sample(index=i, group_index=i, prompt=p)] for i, p in enumerate(prompts)]
        self.added: list[list[Sample]] = []

    def get_samples(self, n: int) -> list[list[Sample]]:
        out, self.groups = self.groups[:n], self.groups[n:]
        return out

    def add_samples(self, groups: list[list[Sample]]) -> None:
        self.added.extend(groups)


def make_spec(tmp_path, *extra: str) -> RolloutSpec:
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text("{}")
    data = tmp_path / "d.jsonl"
    data.write_text('{"input": "q"}\n')
    cfg = parse_config(["--hf-checkpoint", str(model), "--prompt-data", str(data), "--rollout-batch-size", "2",
                        "--num-rollout", "1", "--rollout-max-response-len", "8", "--fully-async",
                        "--max-staleness", "1", *extra])
    return RolloutSpec.from_config(cfg)


@pytest.fixture()
def use(monkeypatch):
    """`use(spec, router)`: a Generator over `spec` with a fake tokenizer and rewards; /generate is `router`."""
    def install(spec: RolloutSpec, router: FakeRouter) -> Generator:
        monkeypatch.setattr(generator_module, "post", router)
        return Generator(spec, tokenizer=FakeTokenizer(), router_url="http://router/generate", rewards=FakeRewards(),
                         plugin_args=None)
    return install


def aborted(tokens: int, versions: list[int], *, abort_count: int = 0) -> Sample:
    return Sample(index=3, prompt=PROMPT, tokens=PROMPT_IDS + list(range(tokens)), response_length=tokens,
                  loss_mask=[1] * tokens, rollout_log_probs=[-0.5] * tokens, weight_versions=list(versions),
                  abort_count=abort_count, status=Sample.Status.ABORTED)


# ---- pure pieces -------------------------------------------------------------------------
def test_resume_request_continues_from_the_partial_response_with_the_budget_left():
    sample = aborted(3, [0])
    input_ids, params = resume_request(sample, PROMPT_IDS, {"max_new_tokens": 8, "min_new_tokens": 4, "top_p": 1})
    assert input_ids == PROMPT_IDS + [0, 1, 2]
    assert params == {"max_new_tokens": 5, "min_new_tokens": 1, "top_p": 1}


def test_resume_request_leaves_a_fresh_sample_alone_and_stops_when_the_budget_is_used():
    assert resume_request(Sample(prompt=PROMPT), PROMPT_IDS, {"max_new_tokens": 8}) == (PROMPT_IDS,
                                                                                       {"max_new_tokens": 8})
    assert resume_request(aborted(8, [0]), PROMPT_IDS, {"max_new_tokens": 8})[1] is None


def test_record_abort_counts_up_to_the_cap_then_only_reports():
    cfg, stats = PartialRolloutSpec(enabled=True, max_aborted_count=1), Counter()
    sample = aborted(2, [0])
    record_abort(sample, cfg, stats, first=True)
    record_abort(sample, cfg, stats, first=False)
    assert sample.abort_count == 1 and sample.loss_mask == [1, 1]
    assert partial_metrics(stats) == {"rollout/partial_aborts": 2.0, "rollout/partial_aborts_over_cap": 1.0,
                                      "rollout/partial_resumed_samples": 1.0, "rollout/partial_resumed_tokens": 4.0,
                                      "rollout/partial_offpolicy_masked_tokens": 0.0}
    assert not stats  # drained: the next step starts from zero


def test_record_abort_masks_every_token_generated_so_far():
    stats = Counter()
    sample = aborted(3, [0])
    sample.loss_mask = [1, 0, 1]  # a 0 already there (e.g. a tool observation) is not counted again
    record_abort(sample, PartialRolloutSpec(enabled=True, mask_offpolicy=True), stats, first=True)
    assert sample.loss_mask == [0, 0, 0] and stats["rollout/partial_offpolicy_masked_tokens"] == 2


def test_resume_until_done_is_a_no_op_without_partial_rollout():
    sample = aborted(2, [0])

    async def never(_: Sample) -> Sample:
        raise AssertionError("resubmitted without --partial-rollout")

    out = asyncio.run(resume_until_done(sample, never, PartialRolloutSpec(enabled=False), Counter()))
    assert out.status == Sample.Status.ABORTED and out.abort_count == 0


# ---- through the default generate, against the fake router --------------------------------
def test_aborted_sample_resumes_on_the_new_weights_from_its_partial_response(tmp_path, use):
    spec = make_spec(tmp_path, "--partial-rollout")
    router = FakeRouter.scripted([reply(3, "abort", 0, first_token=10), reply(2, "stop", 1, first_token=20)])
    step = StepState()
    sample = asyncio.run(use(spec, router).generate_one(step, Sample(index=3, prompt=PROMPT)))

    first, second = router.payloads
    assert first["input_ids"] == PROMPT_IDS and first["sampling_params"]["max_new_tokens"] == 8
    assert second["input_ids"] == PROMPT_IDS + [10, 11, 12] and second["sampling_params"]["max_new_tokens"] == 5
    assert second["sampling_params"]["sampling_seed"] == sample_seed(spec.seed, Sample(index=3, abort_count=1),
                                                                     evaluation=False)
    assert second["sampling_params"]["sampling_seed"] != first["sampling_params"]["sampling_seed"]
    assert sample.tokens == PROMPT_IDS + [10, 11, 12, 20, 21] and sample.response_length == 5
    assert sample.rollout_log_probs == [-0.5] * 5 and sample.loss_mask == [1] * 5
    assert sample.weight_versions == [0, 1] and sample.abort_count == 1
    assert sample.status == Sample.Status.COMPLETED
    assert sample.response == FakeTokenizer().decode([10, 11, 12, 20, 21])  # decoded whole, not per segment
    assert row_version(sample, started_at=0) == 0  # the row stays stamped with its oldest version
    columns = samples_to_columns([sample], [1.0], started_at=0)
    assert columns["loss_masks"][0].tolist() == [1] * 5 and columns["rollout_log_probs"][0].numel() == 5
    assert step.partial_stats["rollout/partial_resumed_samples"] == 1
    assert step.partial_stats["rollout/partial_resumed_tokens"] == 3 and step.done == 1


def test_mask_offpolicy_trains_only_the_tokens_of_the_final_weights(tmp_path, use):
    spec = make_spec(tmp_path, "--partial-rollout", "--mask-offpolicy-in-partial-rollout")
    generator, step = use(spec, FakeRouter.scripted([reply(3, "abort", 0), reply(2, "length", 1)])), StepState()
    sample = asyncio.run(generator.generate_one(step, Sample(index=0, prompt=PROMPT)))
    assert sample.loss_mask == [0, 0, 0, 1, 1] and sample.status == Sample.Status.TRUNCATED
    assert step.partial_stats["rollout/partial_offpolicy_masked_tokens"] == 3


def test_batched_group_resumes_only_its_aborted_samples(tmp_path, use):
    spec = make_spec(tmp_path, "--partial-rollout", "--n-samples-per-prompt", "3")
    router = FakeRouter.scripted([reply(4, "stop", 0), reply(2, "abort", 0, first_token=50), reply(1, "stop", 0),
                                  reply(3, "stop", 1, first_token=60)])
    group = [Sample(index=i, group_index=0, prompt=PROMPT) for i in range(3)]
    done = asyncio.run(use(spec, router).generate_group(StepState(), group))

    assert len(router.payloads) == 2 and len(router.payloads[0]["input_ids"]) == 3  # one batch, then one resume
    assert router.payloads[1]["input_ids"] == PROMPT_IDS + [50, 51]
    assert [s.response_length for s in done] == [4, 5, 1]
    assert [s.abort_count for s in done] == [0, 1, 0]
    assert [s.weight_versions for s in done] == [[0], [0, 1], [0]]
    assert all(s.status == Sample.Status.COMPLETED and s.reward == 1.0 for s in done)


def test_after_the_cap_aborts_stop_counting_and_the_sample_still_completes(tmp_path, use):
    spec = make_spec(tmp_path, "--partial-rollout", "--partial-rollout-max-aborted-count", "1")
    router = FakeRouter.scripted([reply(1, "abort", 0), reply(1, "abort", 1), reply(1, "abort", 2),
                                  reply(1, "stop", 3)])
    step = StepState()
    sample = asyncio.run(use(spec, router).generate_one(step, Sample(index=0, prompt=PROMPT)))

    assert sample.status == Sample.Status.COMPLETED and sample.response_length == 4
    assert sample.abort_count == 1 and sample.weight_versions == [0, 1, 2, 3]
    assert [p["sampling_params"]["max_new_tokens"] for p in router.payloads] == [8, 7, 6, 5]
    seeds = [p["sampling_params"]["sampling_seed"] for p in router.payloads]
    assert seeds[0] != seeds[1] == seeds[2] == seeds[3]  # abort_count (and so the seed) stops at the cap
    assert step.partial_stats["rollout/partial_aborts"] == 3
    assert step.partial_stats["rollout/partial_aborts_over_cap"] == 2


def test_without_partial_rollout_an_aborted_sample_is_not_resubmitted(tmp_path, use):
    router = FakeRouter.scripted([reply(3, "abort", 0)])
    sample = asyncio.run(use(make_spec(tmp_path), router).generate_one(StepState(), Sample(index=0, prompt=PROMPT)))
    assert len(router.payloads) == 1 and sample.status == Sample.Status.ABORTED and sample.abort_count == 0


def test_a_sample_aborted_with_its_whole_budget_ends_truncated_without_another_request(tmp_path, use):
    router = FakeRouter.scripted([reply(8, "abort", 0)])
    generator = use(make_spec(tmp_path, "--partial-rollout"), router)
    sample = asyncio.run(generator.generate_one(StepState(), Sample(index=0, prompt=PROMPT)))
    assert len(router.payloads) == 1
    assert sample.status == Sample.Status.TRUNCATED and sample.response_length == 8 and sample.abort_count == 1


def test_over_sampling_keeps_whole_groups_and_returns_the_surplus_as_untouched_prompts(tmp_path, use):
    spec = make_spec(tmp_path, "--partial-rollout", "--over-sampling-batch-size", "3")

    def answer(ids: list[int], params: dict) -> dict:  # every fresh request is aborted once
        fresh = len(ids) == 1
        return reply(2, "abort", 0) if fresh else reply(1, "stop", 1)

    generator = use(spec, FakeRouter(answer))
    source = FakeDataSource(["a", "b", "c"])
    groups = asyncio.run(generator.rollout(StepState(), 0, source))

    assert [g[0].prompt for g in groups] == ["a", "b"]  # prompt order, not completion order
    assert all(g[0].status == Sample.Status.COMPLETED and g[0].weight_versions == [0, 1] for g in groups)
    assert [g[0].prompt for g in source.added] == ["c"]
    surplus = source.added[0][0]
    assert (surplus.tokens, surplus.abort_count, surplus.weight_versions, surplus.status) == \
        ([], 0, [], Sample.Status.PENDING)
