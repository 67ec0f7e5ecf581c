"""Positions: the paper's sinusoid formula exactly, its linear-shift property, RoPE, ALiBi, learned."""

import math

import pytest
import torch

from aiayn.nn.positional import ALiBiPositions, LearnedPositions, RotaryPositions, SinusoidalPositions, sinusoid_table


def test_sinusoid_matches_paper_formula():
    d_model, length = 16, 50
    table = sinusoid_table(length, d_model)
    for pos in range(length):
        for i in range(d_model // 2):
            angle = pos / 10000 ** (2 * i / d_model)
            assert table[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert table[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)


def test_shift_by_k_is_one_linear_map_for_every_position():
    """Section 3.5: PE(pos + k) = M_k PE(pos) with the same M_k for all pos (a block rotation)."""
    d_model = 32
    table = sinusoid_table(500, d_model).double()
    for k in (1, 7, 100):
        # M_k: the block-diagonal rotation by angle k * w_i, built without reference to any position
        m_k = torch.zeros(d_model, d_model, dtype=torch.float64)
        for i in range(d_model // 2):
            w = k / 10000 ** (2 * i / d_model)
            m_k[2 * i : 2 * i + 2, 2 * i : 2 * i + 2] = torch.tensor([[math.cos(w), math.sin(w)], [-math.sin(w), math.cos(w)]])
        torch.testing.assert_close(table[: 500 - k] @ m_k.T, table[k:], atol=1e-5, rtol=0)


def test_sinusoidal_module_adds_table_and_grows():
    pe = SinusoidalPositions(8, max_len=4)
    x = torch.zeros(2, 10, 8)
    torch.testing.assert_close(pe.embed(x), sinusoid_table(10, 8).expand(2, -1, -1))
    torch.testing.assert_close(pe.embed(torch.zeros(1, 2, 8), offset=5)[0], sinusoid_table(7, 8)[5:])


def test_learned_positions_limit_names_both_lengths():
    pe = LearnedPositions(8, max_len=5)
    with pytest.raises(ValueError, match="sequence of length 6 is longer than the learned positions' max_len=5"):
        pe.embed(torch.zeros(1, 6, 8))
    assert pe.embed(torch.zeros(1, 5, 8)).shape == (1, 5, 8)


def test_rotary_scores_depend_only_on_distance():
    rope = RotaryPositions(8)
    q, k = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)
    scores = []
    for shift in (0, 5, 11):
        q_rot, _ = rope.rotate(q, q, offset=3 + shift)
        _, k_rot = rope.rotate(k, k, offset=1 + shift)
        scores.append((q_rot * k_rot).sum().item())
    assert scores[0] == pytest.approx(scores[1], abs=1e-5) == pytest.approx(scores[2], abs=1e-5)
    # and it preserves norms (a rotation)
    q_rot, _ = rope.rotate(q, q, offset=9)
    assert q_rot.norm().item() == pytest.approx(q.norm().item(), rel=1e-5)


def test_rotary_per_row_offsets():
    rope = RotaryPositions(4)
    q = torch.randn(2, 1, 3, 4)
    rows, _ = rope.rotate(q, q, offset=torch.tensor([0, 2]))
    one, _ = rope.rotate(q[1:], q[1:], offset=2)
    torch.testing.assert_close(rows[1:], one)


def _formula(rope: RotaryPositions, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin (B, 1, T, Dh) written out in float64: angle_i = pos * base^(-2i/Dh), the halves repeated."""
    angle = positions.double()[..., None] * rope.inv_freq.double()
    return torch.cat([angle.cos()] * 2, -1)[:, None], torch.cat([angle.sin()] * 2, -1)[:, None]


def test_rotary_angles_are_read_from_a_table_that_grows_and_equal_the_formula():
    rope = RotaryPositions(8)
    cos, sin = rope.angles(3, 5, torch.device("cpu"))
    assert cos.shape == sin.shape == (1, 1, 5, 8) and cos.dtype == torch.float32
    want = _formula(rope, torch.arange(3, 8)[None])
    torch.testing.assert_close(cos.double(), want[0], rtol=0, atol=1e-6)
    torch.testing.assert_close(sin.double(), want[1], rtol=0, atol=1e-6)
    assert rope._table is not None and rope._table[0].shape[2] == 256  # built once, for the first 256 positions
    far, _ = rope.angles(torch.tensor([1000]), 1, torch.device("cpu"))  # past the table: it grows, still the formula
    assert rope._table[0].shape[2] >= 1001
    torch.testing.assert_close(far.double(), _formula(rope, torch.tensor([[1000]]))[0], rtol=0, atol=1e-4)
    assert "_table" not in str(rope.state_dict().keys())  # derived, never saved


def test_rotary_table_per_row_offsets_and_padding_positions():
    rope = RotaryPositions(4)
    cos, sin = rope.angles(torch.tensor([-2, 5]), 3, torch.device("cpu"))  # row 0: two padding positions, then 0
    assert cos.shape == (2, 1, 3, 4)
    want = _formula(rope, torch.tensor([[0, 0, 0], [5, 6, 7]]))  # negative positions (masked) read position 0
    torch.testing.assert_close(cos.double(), want[0], rtol=0, atol=1e-6)
    torch.testing.assert_close(sin.double(), want[1], rtol=0, atol=1e-6)


def test_rotary_table_is_rebuilt_when_inv_freq_changes():
    rope = RotaryPositions(8)
    before, _ = rope.angles(10, 1, torch.device("cpu"))
    rope.inv_freq.mul_(2)  # in place (a load, a cast), as a model's .to() or a loaded buffer would change it
    after, _ = rope.angles(10, 1, torch.device("cpu"))
    torch.testing.assert_close(after.double(), _formula(rope, torch.tensor([[10]]))[0], rtol=0, atol=1e-6)
    assert not torch.equal(before, after)


def test_alibi_bias():
    alibi = ALiBiPositions(4)
    assert torch.allclose(alibi.slopes, torch.tensor([2**-2, 2**-4, 2**-6, 2**-8]))
    bias = alibi.bias(3, 3)
    assert bias.shape == (1, 4, 3, 3)
    assert bias[0, 0].tolist() == [[0, -0.25, -0.5], [-0.25, 0, -0.25], [-0.5, -0.25, 0]]
    # with a cache offset, query i is at position offset + i
    torch.testing.assert_close(alibi.bias(1, 3, offset=2), bias[:, :, 2:])
