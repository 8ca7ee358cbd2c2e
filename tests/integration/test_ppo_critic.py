"""PPO through the real graph: the critic writes values, the actor trains on GAE advantages and
writes returns, the critic fits them; critic-only steps leave the actor's weights alone; a
critic checkpoint written by one Critic is what the next one loads."""

from __future__ import annotations

import asyncio
import math

import pytest
import torch
from run_helpers import run_relax, step_rows

pytestmark = pytest.mark.integration


def ppo_args(root, exp_dir, *extra: str) -> list[str]:
    return [
        "--hf-checkpoint", str(root / "model"), "--prompt-data", str(root / "train.jsonl"),
        "--input-key", "prompt", "--label-key", "label", "--apply-chat-template",
        "--custom-rm-path", "tests.integration.digit_reward.reward_func", "--advantage-estimator", "ppo",
        "--rollout-batch-size", "4", "--n-samples-per-prompt", "2", "--rollout-max-response-len", "6",
        "--num-rollout", "2", "--lr", "1e-2", "--critic-lr", "1e-2", "--progress-bar", "false",
        "--exp-dir", str(exp_dir), "--resource", '{"actor": [1, 1], "rollout": [1, 1], "critic": [1, 1]}', *extra,
    ]


def test_ppo_trains_policy_and_critic_and_saves_the_critic(ray_cluster, tiny_setup, tmp_path):
    run_relax(ppo_args(tiny_setup, tmp_path, "--save", str(tmp_path / "ckpt"), "--save-interval", "2"))
    steps = step_rows(tmp_path)
    assert len(steps) == 2
    for r in steps:
        assert math.isfinite(r["train/pg_loss"]) and math.isfinite(r["critic/value_loss"])
        assert r["critic/grad_norm"] > 0 and "time/critic_forward" in r
        assert r["train/ppo_kl"] == pytest.approx(0.0, abs=1e-5)
    assert any(r["train/grad_norm"] > 0 for r in steps)
    assert (tmp_path / "ckpt" / "critic" / "latest_checkpointed_iteration.txt").read_text() == "1"
    assert (tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").read_text() == "1"


def test_critic_only_steps_leave_the_actor_weights_unchanged(ray_cluster, tiny_setup, tmp_path):
    from safetensors.torch import load_file

    run_relax(ppo_args(tiny_setup, tmp_path, "--num-critic-only-steps", "2", "--save-hf", str(tmp_path / "hf")))
    steps = step_rows(tmp_path)
    assert [r.get("train/critic_only_step") for r in steps] == [1.0, 1.0]
    assert all("train/pg_loss" not in r and r["critic/grad_norm"] > 0 for r in steps)
    before = load_file(str(tiny_setup / "model" / "model.safetensors"))
    after = load_file(str(tmp_path / "hf" / "model.safetensors"))
    shared = sorted(set(before) & set(after))
    assert len(shared) > 5
    assert all(torch.equal(before[k], after[k]) for k in shared), [k for k in shared if not torch.equal(before[k], after[k])]


def test_critic_checkpoint_round_trips_through_the_component(ray_cluster, tiny_setup, tmp_path):
    from relax.components.critic import Critic
    from relax.config import parse_config
    from relax.core.service import Runtime
    from relax.distributed import transfer_queue as tq

    args = ppo_args(tiny_setup, tmp_path, "--save", str(tmp_path / "ckpt"))
    tokens = [[5, 6, 7, 8, 9, 10], [11, 12, 13, 14]]
    lengths = [3, 2]

    async def put_rows(step: int, returns: list[list[float]] | None = None) -> list[str]:
        keys = ["0", "1"]
        cols = {"tokens": tq._column(tokens, torch.int64, True), "response_lengths": torch.tensor(lengths),
                "loss_masks": tq._column([[1] * n for n in lengths], torch.int64, True)}
        if returns is not None:
            cols["returns"] = tq._column(returns, torch.float32, True)
        await tq.put_columns(step, keys, cols)
        return keys

    async def values_of(critic: Critic, step: int) -> list[list[float]]:
        keys = await put_rows(step)
        await critic.forward(step)
        cols = await tq.get_columns(step, keys, ["values"])
        await tq.clear(step)
        return [v.tolist() for v in cols["values"]]

    async def go():
        first = Critic(parse_config(args))
        assert (await first.setup())["loaded_rollout_id"] is None
        initial = await values_of(first, 0)
        await put_rows(1, returns=[[1.0] * n for n in lengths])
        await first.forward(1)
        metrics = await first.train(1)
        assert metrics["critic/grad_norm"] > 0 and await tq.list_keys(1) == []  # the critic clears the step
        trained = await values_of(first, 2)
        await first.save(1)
        await first.shutdown()
        second = Critic(parse_config(ppo_args(tiny_setup, tmp_path, "--critic-load", str(tmp_path / "ckpt" / "critic"))))
        assert (await second.setup())["loaded_rollout_id"] == 1
        loaded = await values_of(second, 3)
        await second.shutdown()
        return initial, trained, loaded

    with Runtime(parse_config(args)):
        initial, trained, loaded = asyncio.run(go())
    flat = [sum(v, []) for v in (initial, trained, loaded)]
    assert flat[1] != pytest.approx(flat[0], abs=1e-4)  # training moved the values
    assert flat[2] == pytest.approx(flat[1], abs=1e-6)  # the loaded critic is the trained one
