"""Routing replay on a real tiny HF Qwen3-MoE (relax.utils.routing_replay): replayed experts are the
ones used, gate weights come from the router's own logits (bitwise the router's when the ids agree)
and gradients still reach the router; positions a record does not cover route freely."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from relax.utils.routing import RoutingShape
from relax.utils.routing_replay import PaddedRouting, RouterTap, rows_from_batch, targets_for_rows

SHAPE = RoutingShape(layers=2, top_k=2, num_experts=8)


@pytest.fixture(scope="module")
def model():
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    config = Qwen3MoeConfig(vocab_size=50, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
                            num_experts=8, num_experts_per_tok=2, num_hidden_layers=2, num_attention_heads=4,
                            num_key_value_heads=2, head_dim=8, norm_topk_prob=True, initializer_range=0.1)
    torch.manual_seed(0)
    return Qwen3MoeForCausalLM(config).eval()


IDS = torch.randint(1, 50, (3, 9), generator=torch.Generator().manual_seed(1))


def forward(model, tap: RouterTap, targets=None, covered=None):
    tap.arm(targets, covered, record=True)
    logits = model(IDS).logits
    return logits, tap.take()


def test_replaying_the_models_own_routing_changes_nothing_bitwise(model):
    tap = RouterTap(model, SHAPE)
    try:
        with torch.no_grad():
            free, own = forward(model, tap)
            again, used = forward(model, tap, own)
        assert torch.equal(free, again) and torch.equal(own, used)
        assert [layer for layer, _ in tap.routers] == [0, 1]
    finally:
        tap.remove()


def test_replay_forces_the_recorded_experts_with_the_routers_weights(model):
    tap = RouterTap(model, SHAPE)
    seen = []
    probe = model.model.layers[1].mlp.gate.register_forward_hook(lambda m, a, out: seen.append(out))
    try:
        with torch.no_grad():
            _, own = forward(model, tap)
            other = (own + 3) % 8  # every token to other experts than its own
            other[..., 1] = (other[..., 0] + 1) % 8  # two distinct experts a token
            changed, used = forward(model, tap, other)
            tap.arm()  # disarmed: the model's own routing again
            free = model(IDS).logits
        assert torch.equal(used, other)
        logits, weights, ids = seen[1]  # the replayed forward (layer 1)
        expected = torch.softmax(logits.float(), -1).gather(1, other[:, 1])
        assert torch.equal(ids, other[:, 1])
        assert torch.allclose(weights, expected / expected.sum(-1, keepdim=True))
        assert not torch.allclose(changed, free)
    finally:
        probe.remove()
        tap.remove()


def test_gradients_reach_the_router_under_replay(model):
    tap = RouterTap(model, SHAPE)
    try:
        with torch.no_grad():
            _, own = forward(model, tap)
        model.zero_grad()
        tap.arm((own + 1) % 8, record=False)
        model(IDS).logits.logsumexp(-1).mean().backward()
        grad = model.model.layers[0].mlp.gate.weight.grad
        assert grad is not None and torch.isfinite(grad).all() and grad.abs().sum() > 0
    finally:
        model.zero_grad()
        tap.remove()


def test_positions_past_a_record_route_freely(model):
    """Rows right-padded into one batch, each with a record of its first positions only."""
    routing = PaddedRouting(model)
    lengths = [9, 6, 4]
    with torch.no_grad():
        routing.arm(None, True, 9, torch.device("cpu"))
        model(IDS)
        own = routing.recorded(lengths)  # [len - 1, layers, top_k] per row
        forced = [(r + 4) % 8 for r in own]
        partial = [forced[0][:3], forced[1], None]
        routing.arm(partial, True, 9, torch.device("cpu"))
        model(IDS)
        used = routing.recorded(lengths)
    routing.tap.remove()
    assert (used[0][:3] == forced[0][:3]).all() and (used[1] == forced[1]).all()
    assert np.array_equal(np.sort(used[2], -1), np.sort(own[2], -1))  # no record: its own routing
    assert not np.array_equal(used[0][3:], forced[0][3:])  # past the record: not the forced ids


def test_rows_laid_out_and_cut_back_left_and_right_padded():
    rows = [np.arange(n * 2 * 2).reshape(n, 2, 2) % 8 for n in (4, 2)]
    targets, covered = targets_for_rows(rows, 6, SHAPE)
    assert targets.shape == (2, 6, 2, 2) and covered.sum(1).tolist() == [4, 2]
    assert [r.tolist() for r in rows_from_batch(targets, [5, 3], SHAPE)] == [r.tolist() for r in rows]
    left = torch.zeros_like(targets)
    left[0, 2:] = targets[0, :4]
    left[1, 4:] = targets[1, :2]
    cut = rows_from_batch(left, [4, 2], SHAPE, left_padded=True, whole=True)
    assert [r.tolist() for r in cut] == [r.tolist() for r in rows]


def test_a_dense_model_has_no_router_to_tap():
    from transformers import Qwen3Config, Qwen3ForCausalLM

    dense = Qwen3ForCausalLM(Qwen3Config(vocab_size=20, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1, head_dim=8))
    with pytest.raises(ValueError, match="no router"):
        RouterTap(dense, SHAPE)
