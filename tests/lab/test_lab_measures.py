"""The labs' measurements themselves, on sizes small enough for a test."""

import math

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


def test_softmax_gradient_formula():
    # dL/ds for L = g . softmax(s) is p * (g - p . g): what the lab measures through autograd
    s = torch.randn(5, requires_grad=True)
    g = torch.randn(5)
    p = torch.softmax(s, -1)
    (p * g).sum().backward()
    expected = p.detach() * (g - (p.detach() * g).sum())
    assert torch.allclose(s.grad, expected, atol=1e-6)


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
