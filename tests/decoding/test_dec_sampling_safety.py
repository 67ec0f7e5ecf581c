"""Sampling cannot produce NaN or a removed token (issue 31, item 1): the settings are checked in one
place (GenerationConfig), and for any finite settings the sampled ids are valid tokens the filters allow."""

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aiayn.decoding import GenerationConfig, logits_to_probs, sample

pytestmark = pytest.mark.reliability

V = 12


@pytest.mark.parametrize("field, value", [
    ("temperature", math.inf), ("temperature", math.nan), ("temperature", 100.5), ("temperature", -1.0), ("temperature", "1"),
    ("top_p", math.nan), ("top_p", 0.0), ("top_p", math.inf), ("top_p", 1.0000001), ("repetition_penalty", math.inf),
])
def test_non_finite_or_out_of_range_settings_are_refused_naming_the_field(field, value):
    with pytest.raises(ValueError, match=f"^{field}="):
        GenerationConfig(**{field: value})


@pytest.mark.parametrize("temperature, top_p", [(1e-300, None), (1.0, 1e-300), (1e-300, 1e-300), (5e-324, 5e-324), (100.0, None)])
def test_extreme_settings_keep_the_most_likely_token(temperature, top_p):
    """Before: top_p=1e-300 dropped every token (a float32 comparison), temperature=1e-300 made the
    largest logit inf; the probabilities were NaN and multinomial picked id 0."""
    logits = torch.tensor([[0.5, 3.0, -1.0, 2.9], [7.0, -3.0, 6.5, 0.0]])
    probs = logits_to_probs(logits, temperature=temperature, top_p=top_p)
    assert not probs.isnan().any()
    if temperature < 1 or top_p is not None:
        assert probs.argmax(dim=-1).tolist() == [1, 0] and torch.equal(sample(probs), torch.tensor([1, 0]))


def _allowed(logits, temperature, top_k, top_p):
    """The tokens the filters may keep, from the definitions: the top k (ties included), then those whose
    more likely tokens hold less than p of the mass (ties either way: any order is a valid nucleus)."""
    keep = torch.ones_like(logits, dtype=torch.bool)
    if top_k is not None:
        keep &= logits >= logits.topk(min(top_k, V), dim=-1).values[..., -1:]
    if top_p is not None:
        x = logits.double()
        p = ((x - x.amax(dim=-1, keepdim=True)) / temperature).masked_fill(~keep, -math.inf).softmax(dim=-1)
        before = (p[:, None, :] * (p[:, None, :] > p[:, :, None])).sum(dim=-1)  # (B, V): mass of more likely tokens
        keep &= before < top_p * (1 + 1e-9) + 1e-15
    return keep


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    logits=st.lists(st.floats(-1e4, 1e4, allow_nan=False), min_size=2 * V, max_size=2 * V),
    temperature=st.floats(min_value=5e-324, max_value=100.0),
    top_k=st.none() | st.integers(1, V + 3),
    top_p=st.none() | st.floats(min_value=5e-324, max_value=1.0),
    seed=st.integers(0, 2**16),
)
def test_sampled_ids_are_valid_tokens_the_filters_allow(logits, temperature, top_k, top_p, seed):
    config = GenerationConfig(temperature=temperature, top_k=top_k, top_p=top_p)  # accepted: finite and in range
    x = torch.tensor(logits, dtype=torch.float32).view(2, V)
    probs = logits_to_probs(x, config.temperature, config.top_k, config.top_p)
    assert not probs.isnan().any() and torch.allclose(probs.sum(dim=-1), torch.ones(2, dtype=probs.dtype))
    ids = sample(probs, torch.Generator().manual_seed(seed))
    assert ((ids >= 0) & (ids < V)).all()
    assert (probs.gather(-1, ids[:, None]) > 0).all()  # never a token the filters removed
    assert _allowed(x, temperature, top_k, top_p).gather(-1, ids[:, None]).all()
    best = x.argmax(dim=-1, keepdim=True)
    assert (probs.gather(-1, best) > 0).all()  # the most likely token is always kept
