"""Rollout.run (the streaming plan), without engines: steps overlap once the previous one has
drawn its prompts, the staleness gate still holds, each step's data position is the one right
after its own draw, and a failed step reaches whoever waits for it. Rollout.generate: the rewards
a step writes (--custom-reward-post-process-path); the prompt source (--data-source-path)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from relax.components import rollout as rollout_module
from relax.components.rollout import Rollout, make_data_source
from relax.config.schema import RelaxConfig
from relax.types import Sample


class Counter:
    """A data source whose position is how many prompts it handed out."""

    def __init__(self) -> None:
        self.position = 0

    def state_dict(self) -> dict:
        return {"position": self.position}


def rollout(bound: int, generate) -> Rollout:
    r = object.__new__(Rollout)
    r.plan = SimpleNamespace(max_staleness=bound)
    r.finished, r.step_events, r.snapshots, r.failed = {}, {}, {}, {}
    r.stopping, r.data_source, r.engine = False, Counter(), 0
    r.generate = generate

    async def busy():
        return {}

    async def wait_version(minimum: int) -> int:  # the engines' version: `r.engine`
        while r.engine < minimum:
            await asyncio.sleep(0.001)
        return r.engine

    r._engine_busy_seconds, r._wait_engine_version = busy, wait_version
    return r


def drawing(r: Rollout, release: dict[int, asyncio.Event], log: list, *, announce: bool = True):
    """A generate that draws 4 prompts, says so (as the default rollout function does), then
    waits until the test releases the step."""
    async def generate(step: int, *, state, started_at: int) -> dict:
        r.data_source.position += 4
        log.append(("start", step))
        if announce:  # the step's own StepState, handed to it by `run`
            state.prompts_drawn.set()
        await release.setdefault(step, asyncio.Event()).wait()
        log.append(("end", step))
        return {}
    return generate


def test_next_step_starts_once_prompts_are_drawn_within_the_bound():
    async def main():
        release, log = {}, []
        r = rollout(2, None)
        r.generate = drawing(r, release, log)
        task = asyncio.create_task(r.run(0, 5))
        await asyncio.sleep(0.05)
        # Version 0, bound 2: steps 0, 1, 2 run at once; step 3 waits for version 1.
        assert log == [("start", 0), ("start", 1), ("start", 2)]
        assert r.snapshots == {0: {"position": 4}, 1: {"position": 8}, 2: {"position": 12}}
        release[1].set()  # a later step may finish first
        metrics = await asyncio.wait_for(r.wait_step(1), 5)
        assert metrics["rollout/started_at_version"] == 0.0
        r.engine = 1
        await asyncio.sleep(0.05)
        assert ("start", 3) in log and ("start", 4) not in log
        for s in range(5):
            release.setdefault(s, asyncio.Event()).set()
        r.engine = 2
        await asyncio.wait_for(task, 5)
        assert r.snapshots[4] == {"position": 20}

    asyncio.run(main())


def test_a_rollout_function_that_never_says_it_drew_runs_steps_one_after_another():
    async def main():
        release, log = {}, []
        r = rollout(2, None)
        r.generate = drawing(r, release, log, announce=False)
        task = asyncio.create_task(r.run(0, 2))
        await asyncio.sleep(0.05)
        assert log == [("start", 0)]
        release[0].set()
        await asyncio.sleep(0.05)
        assert log == [("start", 0), ("end", 0), ("start", 1)]
        assert r.snapshots[0] == {"position": 4}
        release[1].set()
        await asyncio.wait_for(task, 5)

    asyncio.run(main())


def test_a_failed_step_reaches_its_waiter_and_fails_the_run():
    async def main():
        r = rollout(1, None)

        async def generate(step: int, *, state, started_at: int) -> dict:
            raise ValueError("reward server down")

        r.generate = generate
        task = asyncio.create_task(r.run(0, 3))
        with pytest.raises(RuntimeError, match="rollout step 0 failed: ValueError: reward server down"):
            await asyncio.wait_for(r.wait_step(0), 5)
        with pytest.raises(ValueError, match="reward server down"):
            await asyncio.wait_for(task, 5)

    asyncio.run(main())


def post_process(args, samples):
    """A --custom-reward-post-process-path plugin: (raw rewards, rewards to train on)."""
    return [s.reward for s in samples], [10.0 * s.reward + s.index for s in samples]


def written_rewards(monkeypatch, post) -> list[float]:
    """The rewards one Rollout.generate step writes to TransferQueue (no engines, no data system)."""
    written = []

    async def put_samples(step, samples, rewards, train_data=None, **kwargs):
        written.extend(rewards)

    async def nothing(*args, **kwargs):
        return {}

    monkeypatch.setattr(rollout_module.tq, "put_samples", put_samples)
    monkeypatch.setattr(rollout_module.tq, "mark_step_done", nothing)
    r = object.__new__(Rollout)
    r.cfg, r.args = RelaxConfig(), RelaxConfig().args
    r.plan = SimpleNamespace(overlapping_steps=False, stream_groups=False, role=SimpleNamespace(writes=()))
    r.profiler = SimpleNamespace(start=nothing, stop=nothing)
    r.generator = SimpleNamespace(spec=SimpleNamespace(routing=None))
    r.rewards = SimpleNamespace(reward_value=lambda s: s.reward, stats=lambda reset: {})
    r.reward_post_process, r.convert_samples = post, None
    r._engine_busy_seconds = nothing
    r.step_logs = SimpleNamespace(rollout=nothing)

    async def groups(step, rollout_id):
        return [[Sample(index=i, group_index=0, reward=float(i)) for i in range(2)]]

    r.rollout_fn = groups
    asyncio.run(r.generate(0))
    return written


def test_custom_reward_post_process_path_s_rewards_are_the_ones_written(monkeypatch):
    assert written_rewards(monkeypatch, None) == [0.0, 1.0]  # unset: the samples' own rewards
    assert written_rewards(monkeypatch, post_process) == [0.0, 11.0]  # the plugin's second list


class ListSource:
    """A --data-source-path plugin: constructed with the run's args."""

    def __init__(self, args) -> None:
        self.args = args


def test_data_source_path_picks_the_class_the_rollout_draws_prompts_from(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text('{"input": "q"}\n')
    cfg = RelaxConfig().replace(prompt_data=str(data))
    default = make_data_source(cfg, cfg.args)
    assert type(default).__name__ == "RolloutDataSourceWithBuffer" and len(default) == 1
    custom = make_data_source(cfg.replace(data_source_path=f"{__name__}.ListSource"), cfg.args)
    assert isinstance(custom, ListSource) and custom.args.prompt_data == str(data)
