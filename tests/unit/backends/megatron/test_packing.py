"""--qkv-format thd (`relax.backends.megatron.packing`): packed rows attend within their row only,
exactly as the same rows padded; RoPE positions restart per row; the pad segment fills the stream
to the count asked for. (The whole model packed against padded and fsdp: test_parity.py's
`test_thd_packs_rows_and_matches_bshd`.)"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("megatron.core")

from relax.backends.megatron.packing import PackedRoPE, pack, packed_attention  # noqa: E402


def test_pack_lays_rows_out_in_segments_with_a_pad_segment():
    rows = pack([3, 1, 2], 8, torch.device("cpu"))
    assert rows.starts_S.tolist() == [0, 3, 4, 6] and (rows.segments, rows.longest) == (4, 3)
    assert rows.positions_N.tolist() == [0, 1, 2, 0, 0, 1, 0, 1]
    assert rows.slots_N.tolist() == [0, 1, 2, 3, 6, 7, 9, 10]  # segment s's tokens from slot 3 s
    assert pack([3, 1], 4, torch.device("cpu")).segments == 2  # filled: no pad segment


def test_packed_rope_gives_each_token_its_in_row_position_for_one_forward():
    class Rope(torch.nn.Module):
        def get_emb(self, n: int) -> torch.Tensor:
            return torch.arange(n, dtype=torch.float32)[:, None, None, None]  # [n, 1, 1, 1]

        def forward(self, n: int) -> torch.Tensor:
            return self.get_emb(n)

    rope, rows = Rope(), pack([3, 2], 6, torch.device("cpu"))
    with PackedRoPE(rope, rows):
        assert rope(6).flatten().tolist() == [0, 1, 2, 0, 1, 0]
    assert rope(3).flatten().tolist() == [0, 1, 2]  # the model's own again


@pytest.mark.parametrize("heads,groups", [(4, 4), (4, 2)])
def test_packed_attention_equals_each_row_attended_alone(heads, groups):
    torch.manual_seed(0)
    lengths, d = [5, 2, 7], 8
    rows = pack(lengths, sum(lengths) + 2, torch.device("cpu"))
    n = sum(lengths) + 2
    q = torch.randn(n, heads, d, requires_grad=True)
    k, v = torch.randn(n, groups, d), torch.randn(n, groups, d)
    out = packed_attention(q, k, v, rows, scale=None, gqa=heads != groups)  # [N, heads * d]
    assert out.shape == (n, heads * d)
    start = 0
    for length in lengths:
        part = slice(start, start + length)
        qs, ks, vs = (t[part].transpose(0, 1)[None] for t in (q, k, v))  # [1, h, L, d]
        ref = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, enable_gqa=heads != groups)
        assert torch.allclose(out[part], ref[0].transpose(0, 1).reshape(length, -1), atol=1e-6)
        start += length
    out[:lengths[0]].sum().backward()  # a row's output depends on its own queries only
    assert q.grad[:lengths[0]].abs().sum() > 0 and not q.grad[lengths[0]:].any()
