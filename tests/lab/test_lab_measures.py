"""The labs' measurements themselves, on sizes small enough for a test."""

import math

import pytest
import torch

from aiayn.lab.scaling import measure
from aiayn.lab.smoothing import Language, _batch
from aiayn.tokenization.special import BOS_ID, EOS_ID, PAD_ID


def test_unscaled_scores_have_variance_d_k_and_saturate():
    g = torch.Generator().manual_seed(0)
    scaled = measure(256, rows=256, keys=32, scaled=True, generator=g)
    unscaled = measure(256, rows=256, keys=32, scaled=False, generator=g)
    assert 0.8 < scaled["score_var"] < 1.25
    assert 180 < unscaled["score_var"] < 340
    assert unscaled["max_prob"] > 0.8 > 0.5 > scaled["max_prob"]
    assert unscaled["grad_norm_median"] < 0.2 * scaled["grad_norm_median"]
    assert 0 <= unscaled["entropy"] < scaled["entropy"] <= 1


@pytest.mark.parametrize("scaled", [True, False])
def test_measure_takes_the_softmax_gradient_of_the_scores_it_draws(scaled):
    """The lab's numbers against their closed forms on the same draws: the scores q.k (over sqrt(d_k) when
    scaled), and the gradient with respect to them, p * (g - p.g) (of the scaled scores, not the raw ones)."""
    d_k, rows, keys = 64, 8, 16
    got = measure(d_k, rows=rows, keys=keys, scaled=scaled, generator=torch.Generator().manual_seed(3))
    g = torch.Generator().manual_seed(3)
    q, k = torch.randn(rows, d_k, generator=g), torch.randn(keys, d_k, generator=g)  # measure's draws, in order
    scores = q @ k.T / (math.sqrt(d_k) if scaled else 1.0)
    upstream = torch.randn(rows, keys, generator=g)
    p = torch.softmax(scores, -1)
    grad = p * (upstream - (p * upstream).sum(-1, keepdim=True))
    entropy = -(p * p.log()).sum(-1) / math.log(keys)
    expected = {"score_var": scores.var(), "max_prob": p.max(-1).values.mean(), "entropy": entropy.mean(),
                "grad_norm": grad.norm(dim=-1).mean(), "grad_norm_median": grad.norm(dim=-1).median()}
    for name, value in expected.items():
        assert got[name] == pytest.approx(float(value), rel=1e-4, abs=1e-7), name


def test_synthetic_language_reorders_and_pads():
    import random

    rng = random.Random(0)
    lang = Language(rng)
    src, tgt = lang.pair(rng)
    assert len(src) == len(tgt) and 2 <= len(src) <= 10
    for word in src:
        assert word in lang.translations
    batch = _batch([([7, 8], [40, 41]), ([9], [42])])
    assert batch[0].tolist() == [[7, 8, EOS_ID], [9, EOS_ID, PAD_ID]]
    assert batch[1].tolist() == [[BOS_ID, 40, 41], [BOS_ID, 42, PAD_ID]]
    assert batch[2].tolist() == [[40, 41, EOS_ID], [42, EOS_ID, PAD_ID]]
    ambiguous = [w for w, opts in lang.translations.items() if len(opts) == 2]
    assert len(ambiguous) == math.ceil((8 + 16) / 3)


def test_recall_batch_asks_every_key_once_and_targets_its_value():
    from aiayn.lab.efficient import recall_batch

    x, y = recall_batch(3, 5, 8, 6, torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (3, 20)
    for row in range(3):
        shown = dict(zip(x[row, 0:10:2].tolist(), x[row, 1:10:2].tolist()))
        assert len(shown) == 5 and all(k < 8 <= v < 14 for k, v in shown.items())  # distinct keys, values after the keys
        asked = x[row, 10::2].tolist()
        assert sorted(asked) == sorted(shown)  # every key asked once, in some order
        assert x[row, 11::2].tolist() == [shown[k] for k in asked]  # each followed by its value
        assert y[row, 10::2].tolist() == [shown[k] for k in asked]  # the target at each asked key: its value
        assert (y[row, :10] == -100).all() and (y[row, 11::2] == -100).all()
