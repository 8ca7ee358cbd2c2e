"""Context-parallel layouts (`relax.backends.megatron.attention`): the load-balanced 2C-chunk split
and --allgather-cp's C contiguous chunks each cover every position once, with a causal mask over the
all-gathered keys by global position and RoPE cut to the rank's positions. (Whole models under both
layouts against fsdp: test_parity.py's cp2 and cp2ag cases.)"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("megatron.core")

from relax.backends.megatron.attention import cp_causal_mask, cp_positions, install_cp_rope  # noqa: E402


@pytest.mark.parametrize("contiguous", [False, True])
def test_each_layout_covers_every_position_once(contiguous):
    held = [cp_positions(8, 2, r, contiguous).tolist() for r in range(2)]
    assert held == ([[0, 1, 2, 3], [4, 5, 6, 7]] if contiguous else [[0, 1, 6, 7], [2, 3, 4, 5]])
    assert sorted(held[0] + held[1]) == list(range(8))


@pytest.mark.parametrize("contiguous", [False, True])
def test_the_mask_shows_each_query_the_keys_at_or_before_it(contiguous):
    keys = torch.cat([cp_positions(8, 2, r, contiguous) for r in range(2)])
    for rank in range(2):
        mask = cp_causal_mask(8, 2, rank, contiguous)[0, 0]  # True = masked
        queries = cp_positions(8, 2, rank, contiguous)
        assert torch.equal(~mask, keys[None, :] <= queries[:, None])


def test_allgather_cp_cuts_rope_to_the_contiguous_chunk():
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding

    from relax.backends.megatron import cpu_shim

    cpu_shim.apply()  # as a rank does: megatron-core's RoPE asks for the CUDA device
    rope = RotaryEmbedding(kv_channels=8, rotary_percent=1.0, use_cpu_initialization=True)
    full = rope.get_emb(8)
    install_cp_rope(rope, 2, 1)
    assert torch.equal(rope(8), full[4:8])
