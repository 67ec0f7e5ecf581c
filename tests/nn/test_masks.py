"""The mask helpers: one convention, True = may attend."""

import pytest
import torch

from aiayn.nn.masks import attention_mask, causal_mask, padding_mask_from_lengths


def test_padding_from_lengths():
    mask = padding_mask_from_lengths(torch.tensor([3, 1, 0]), 4)
    assert mask.tolist() == [[True, True, True, False], [True, False, False, False], [False] * 4]


def test_padding_from_lengths_errors():
    with pytest.raises(ValueError, match="lengths must be <= max_len=2, got a length of 3"):
        padding_mask_from_lengths(torch.tensor([3]), 2)
    with pytest.raises(ValueError, match="lengths must be >= 0, got min -1"):
        padding_mask_from_lengths(torch.tensor([-1]), 2)
    with pytest.raises(TypeError, match="integer tensor"):
        padding_mask_from_lengths(torch.tensor([1.0]), 2)


def test_causal_square_is_lower_triangular():
    assert torch.equal(causal_mask(4), torch.ones(4, 4, dtype=torch.bool).tril())


def test_causal_lower_right_alignment():
    # 2 new queries after 3 cached keys: query 0 is position 3, query 1 is position 4
    assert causal_mask(2, 5).tolist() == [[True, True, True, True, False], [True] * 5]


def test_causal_needs_enough_keys():
    with pytest.raises(ValueError, match="k_len must be >= q_len"):
        causal_mask(3, 2)


def test_combined_mask():
    pad = torch.tensor([[True, True, False]])
    mask = attention_mask(pad, causal=True, q_len=3)
    assert mask.shape == (1, 1, 3, 3)
    assert mask[0, 0].tolist() == [[True, False, False], [True, True, False], [True, True, False]]
    assert attention_mask(None) is None
    assert attention_mask(pad).shape == (1, 1, 1, 3)


def test_attention_mask_rejects_float_padding():
    with pytest.raises(TypeError, match="key_padding must be a torch.bool tensor"):
        attention_mask(torch.ones(1, 3))
