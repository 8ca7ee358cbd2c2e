"""PPO through the real graph: the critic writes values, the actor trains on GAE advantages and
writes returns, the critic fits them; critic-only steps leave the actor's weights alone; a
critic checkpoint written by one Critic is what the next one loads."""

from __future__ import annotations

import asyncio
import math

import pytest
import torch
from run_helpers import run_relax, step_rows

from relax.utils import checkpoints

pytestmark = pytest.mark.integration


def ppo_args(root, exp_dir, *extra: str) -> list[str]:
    return [
        "--hf-checkpoint", str(root / "model"), "--prompt-data", str(root / "train.jsonl"),
        "--input-key", "prompt", "--label-key", "label", "--apply-chat-template",
        "--custom-rm-path", "tests.integration.digit_reward.reward_func",
        "--reward-num-workers", "1", "--advantage-estimator", "ppo",
        "--rollout-batch-size", "4", "--n-samples-per-prompt", "2", "--rollout-max-response-len", "6",
        "--lr", "1e-2", "--critic-lr", "1e-2", "--progress-bar", "false",
        "--exp-dir", str(exp_dir), "--resource", '{"actor": [1, 1], "rollout": [1, 1], "critic": [1, 1]}', *extra,
    ]


def actor_weights(checkpoint) -> dict[str, torch.Tensor]:
    """The actor's model weights in a DCP checkpoint directory written by the fsdp backend."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    dcp_to_torch_save(str(checkpoint / "model"), str(checkpoint / "flat.pt"))
    return torch.load(checkpoint / "flat.pt", weights_only=False)["model"]


def test_ppo_critic_only_steps_then_policy_and_critic_train_and_save(ray_cluster, tiny_setup, tmp_path):
    """Step 0 trains only the critic (the actor's weights stay the initial ones); steps 1-2 train
    both; checkpoints of the actor and the critic are written every step."""
    from safetensors.torch import load_file

    run_relax(ppo_args(tiny_setup, tmp_path, "--num-rollout", "3", "--num-critic-only-steps", "1",
                       "--save", str(tmp_path / "ckpt"), "--save-interval", "1"))
    steps = step_rows(tmp_path)
    assert len(steps) == 3 and steps[0].get("train/critic_only_step") == 1.0 and "train/pg_loss" not in steps[0]
    assert all(r["critic/grad_norm"] > 0 and math.isfinite(r["critic/value_loss"]) for r in steps)
    for r in steps[1:]:
        assert math.isfinite(r["train/pg_loss"]) and "time/critic_forward" in r and "train/critic_only_step" not in r
        assert r["train/ppo_kl"] == pytest.approx(0.0, abs=1e-5)
    assert any(r["train/grad_norm"] > 0 for r in steps[1:])
    assert (tmp_path / "ckpt" / "critic" / "latest_checkpointed_iteration.txt").read_text() == "2"
    assert (tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").read_text() == "2"
    point = checkpoints.resume_point(str(tmp_path / "ckpt"))  # one checkpoint, three parts, complete
    assert point.rollout_id == 2 and set(point.parts) == {"actor", "critic", "rollout"}

    before = load_file(str(tiny_setup / "model" / "model.safetensors"))
    after_critic_only = actor_weights(tmp_path / "ckpt" / "iter_0000000")
    after_training = actor_weights(tmp_path / "ckpt" / "iter_0000002")
    shared = sorted(set(before) & set(after_critic_only))
    assert len(shared) > 5
    assert all(torch.equal(before[k], after_critic_only[k]) for k in shared), \
        [k for k in shared if not torch.equal(before[k], after_critic_only[k])]
    assert any(not torch.equal(before[k], after_training[k]) for k in shared)  # the actor trained later


def test_critic_checkpoint_round_trips_through_the_component(ray_cluster, tiny_setup, tmp_path):
    from relax.components.critic import Critic
    from relax.components.setup_context import SetupContext
    from relax.config import parse_config
    from relax.config.plan import resolve_plan
    from relax.core.service import Runtime
    from relax.distributed import transfer_queue as tq

    args = ppo_args(tiny_setup, tmp_path, "--num-rollout", "1", "--save", str(tmp_path / "ckpt"))
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

    def critic(cfg) -> Critic:
        return Critic(cfg, resolve_plan(cfg).role("critic"))

    async def ready(role: Critic) -> SetupContext:
        await role.start()
        return await role.setup(SetupContext())

    async def go():
        first = critic(parse_config(args))
        assert (await ready(first)).critic_loaded_rollout_id is None
        initial = await values_of(first, 0)
        await put_rows(1, returns=[[1.0] * n for n in lengths])
        await first.forward(1)
        metrics = await first.train(1)
        assert metrics["critic/grad_norm"] > 0 and await tq.list_keys(1) == []  # the critic clears the step
        trained = await values_of(first, 2)
        checkpoints.commit(str(tmp_path / "ckpt"), 1, await first.save(1))  # as the Controller does
        await first.shutdown()
        second = critic(parse_config(ppo_args(tiny_setup, tmp_path, "--num-rollout", "1",
                                              "--critic-load", str(tmp_path / "ckpt" / "critic"))))
        assert (await ready(second)).critic_loaded_rollout_id == 1
        loaded = await values_of(second, 3)
        await second.shutdown()
        return initial, trained, loaded

    with Runtime(parse_config(args)):
        initial, trained, loaded = asyncio.run(go())
    flat = [sum(v, []) for v in (initial, trained, loaded)]
    assert flat[1] != pytest.approx(flat[0], abs=1e-4)  # training moved the values
    assert flat[2] == pytest.approx(flat[1], abs=1e-6)  # the loaded critic is the trained one
