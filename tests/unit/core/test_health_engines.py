"""The HealthManager over engines that get no weight pushes (a GenRM judge, an OPD teacher engine),
in a run that has both: one killed (SIGKILL) with a request in flight is replaced in place (tier 1)
by a fresh engine from the same checkpoint and the request is sent again (one reply); one that hangs
(SIGSTOP) is replaced too, its request sent again; a slot that fails once more than
--max-engine-replacements allows is given up, with an event, and escalated to tier 2.

Everything is real: the GenRM and Teacher roles with their fleets and routers, and real `hf` engine
processes serving a tiny Qwen3 built here, killed and stopped with real signals. The three failure
kinds are spread over the two roles (judge: killed, then given up; teacher: hung), so the whole
test starts four engines, the first two side by side."""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import signal

import pytest

from relax.config import parse_config
from relax.config.plan import resolve_plan
from relax.core.health import EngineSlots, HealthEvents, HealthManager, RecoveryError
from relax.utils.http_utils import close_sessions, post


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> str:
    """A random-init tiny Qwen3 with its own tokenizer (no hub), the judge's and the teacher's checkpoint."""
    from relax.utils.tiny_model import build_tiny_qwen3, save_tiny_model, train_chatml_tokenizer

    tokenizer = train_chatml_tokenizer(["Is 7 the answer to 3+4? Score: 1", "The answer is 12. Score: 0"],
                                       vocab_size=300)
    return save_tiny_model(build_tiny_qwen3(tokenizer), tokenizer, str(tmp_path_factory.mktemp("tiny") / "model"))


class Direct:
    """`await role.method(...)` on a role object of this process, as the Controller's Serve handle does."""

    def __init__(self, role) -> None:
        self.role = role

    def __getattr__(self, name):
        async def call(*args, **kwargs):
            out = getattr(self.role, name)(*args, **kwargs)
            return await out if inspect.isawaitable(out) else out
        return call


async def held_at(fleet, url: str) -> None:
    """Until the engine at `url` holds a request (the router sent it there and the engine queued it)."""
    while not (fleet.router.in_flight.get(url) and (await fleet.clients[url].get_server_info())["queued_requests"]):
        await asyncio.sleep(0.01)


def test_engines_without_pushed_weights_are_replaced_in_place_until_their_slot_is_spent(base, tiny_model):
    from relax.components.genrm import GenRM
    from relax.components.teacher import Teacher

    cfg = parse_config(base + [
        "--rm-type", "genrm", "--genrm-model-path", tiny_model,
        "--use-opd", "--opd-type", "sglang", "--opd-teacher-load", tiny_model,
        "--use-fault-tolerance", "--use-health-check", "--rollout-health-check-timeout", "1",
        "--max-engine-replacements", "1"])
    plan = resolve_plan(cfg, 0.0)
    os.makedirs(cfg.misc.exp_dir)  # (the Controller makes it before a run)
    judge, teacher = GenRM(cfg, plan.part("genrm")), Teacher(cfg, plan.part("teacher"))
    engines = {}  # "judge", "teacher" (the first ones), "new judge", "new teacher": their engine processes

    async def main():
        await asyncio.gather(judge.start(), teacher.start())
        health = HealthManager(cfg, plan, {"genrm": Direct(judge), "teacher": Direct(teacher)},
                               HealthEvents(cfg.misc.exp_dir), {})
        judges, teachers = judge.fleet, teacher.scorer.fleet
        engines.update(judge=judges.engines[0], teacher=teachers.engines[0])
        try:
            # The judge is killed holding a request (paused, it queues what it gets).
            await judges.clients[engines["judge"].url].pause_generation()
            asking = asyncio.ensure_future(post(judges.router_url + "/generate", {
                "text": "Is 7 the answer to 3+4?", "sampling_params": {"max_new_tokens": 8, "ignore_eos": True}},
                timeout=60))
            await held_at(judges, engines["judge"].url)
            engines["judge"].process.send_signal(signal.SIGKILL)
            engines["judge"].process.wait()
            # The teacher hangs with a scoring request sent to it.
            engines["teacher"].process.send_signal(signal.SIGSTOP)
            scoring = asyncio.ensure_future(teacher.scorer.score([[5, 6, 7, 8]], [2]))
            while not teachers.router.in_flight[engines["teacher"].url]:
                await asyncio.sleep(0.01)
            await health.check_engines()  # both found (dead, hung) and replaced; their requests go to the new ones
            engines.update({"new judge": judges.engines[0], "new teacher": teachers.engines[0]})
            replies = await asyncio.gather(asking, scoring)
            served = await judges.clients[engines["new judge"].url].get_server_info()
            resent = [judge.requests_resent(), teacher.requests_resent()]
            engines["new judge"].process.send_signal(signal.SIGKILL)  # the slot's second failure: tier 1 gives up
            engines["new judge"].process.wait()
            with pytest.raises(RecoveryError) as escalated:
                await health.check_engines()
            return replies, served, resent, str(escalated.value), health.metrics()
        finally:
            await judge.shutdown()
            await teacher.shutdown()
            await close_sessions()

    (reply, logprobs), served, resent, escalated, metrics = asyncio.run(main())
    events = [json.loads(line) for line in open(os.path.join(cfg.misc.exp_dir, "health_events.jsonl"))]
    print([e["message"][:150] for e in events])
    # One reply each, from the replacement (the engine that held the request is gone).
    assert reply["meta_info"]["completion_tokens"] == 8 == served["generated_tokens"]
    assert len(logprobs) == 1 and len(logprobs[0]) == 2 and all(lp <= 0 for lp in logprobs[0])
    assert resent == [1, 1]  # each request sent again once, by its role's router
    assert [(e["kind"], e["role"]) for e in events] == [
        ("engine_failed", "genrm"), ("engine_replaced", "genrm"), ("engine_failed", "teacher"),
        ("engine_replaced", "teacher"), ("engine_failed", "genrm"), ("engine_escalated", "genrm")]
    died, judge_replaced, hung, teacher_replaced, _, given_up = events
    assert died["message"].startswith(f"genrm engine {engines['judge'].url} died: hf engine pid")
    assert hung["message"].startswith(f"teacher engine {engines['teacher'].url} no answer to GET /health within 1s")
    for replaced, name in ((judge_replaced, "judge"), (teacher_replaced, "teacher")):
        old, new = engines[name], engines[f"new {name}"]
        assert (replaced["engine"], replaced["replacement"]) == (old.url, new.url)
        assert "holding its checkpoint's weights (no weight pushes) (replacement 1/1 of its slot)" \
            in replaced["message"]
        assert new.log_path == old.log_path.replace(".log", ".restart1.log")  # its predecessor's slot
    assert given_up["engine"] == engines["new judge"].url and given_up["replacements"] == 1
    assert "replaced 1 time(s) in this attempt (--max-engine-replacements 1)" in escalated
    assert "a global restart from the last checkpoint follows (tier 2)" in escalated
    assert metrics["health/engine_restarts"] == 2 and metrics["health/engine_escalations"] == 1
    assert metrics["health/requests_resent"] == 2 and metrics["health/engine_failures"] == 3
    assert not any(e.alive() for e in engines.values())  # killed, replaced, or stopped with the role


def test_an_engine_slot_counts_the_replacements_of_every_engine_that_held_it():
    slots = EngineSlots(limit=2)
    assert slots.replaced("rollout", "http://a", "http://b") == 1 and not slots.spent("rollout", "http://b")
    assert slots.replaced("rollout", "http://b", "http://c") == 2 and slots.spent("rollout", "http://c")
    assert not slots.spent("genrm", "http://c") and not slots.spent("rollout", "http://d")  # other slots
    assert EngineSlots(limit=0).spent("rollout", "http://a")  # 0: never replaced, escalated at once
