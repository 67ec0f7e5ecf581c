"""models.meta: the meta build has exactly the real model's keys, shapes and dtypes, and allocates nothing."""

import pytest
import torch

from aiayn import build_model
from aiayn.models.meta import meta_state_dict


@pytest.mark.parametrize("preset", ["tiny-encoder-decoder", "tiny-decoder-only", "tiny-encoder-only"])
def test_meta_build_matches_the_real_one(preset):
    real = build_model(preset, vocab_size=50).state_dict()
    meta = meta_state_dict(build_model(preset, vocab_size=50).config)
    assert list(meta) == list(real)
    assert all(meta[k].is_meta and meta[k].shape == real[k].shape and meta[k].dtype == real[k].dtype for k in real)


def test_normal_init_outside_the_meta_build_is_untouched():
    meta_state_dict(build_model("tiny-decoder-only", vocab_size=50).config)
    x = torch.zeros(1000)
    torch.nn.init.normal_(x)
    assert x.std() > 0.5
