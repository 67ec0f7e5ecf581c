"""Input checks happen on the host before any compute, with messages that name what was wrong."""

import pytest
import torch

from aiayn import build_model


@pytest.fixture(scope="module")
def models():
    torch.manual_seed(0)
    return {name: build_model(name).eval() for name in ("tiny-encoder-decoder", "tiny-decoder-only", "tiny-encoder-only")}


@pytest.mark.reliability
def test_token_id_out_of_range_names_largest_id(models):
    with pytest.raises(ValueError, match="src holds token id 70, outside the vocabulary of vocab_size=64"):
        models["tiny-encoder-decoder"](torch.tensor([[5, 70, 3]]), torch.tensor([[1, 2]]))
    with pytest.raises(ValueError, match="tgt holds token id 64"):
        models["tiny-encoder-decoder"](torch.tensor([[5, 6]]), torch.tensor([[1, 64]]))
    with pytest.raises(ValueError, match="ids holds token id 99, outside the vocabulary of vocab_size=64"):
        models["tiny-decoder-only"](torch.tensor([[99, 1]]))
    with pytest.raises(ValueError, match="negative token id -1"):
        models["tiny-encoder-only"](torch.tensor([[-1, 1]]))


def test_float_ids_rejected(models):
    with pytest.raises(TypeError, match="ids must be an integer tensor of token ids, got torch.float32"):
        models["tiny-decoder-only"](torch.zeros(1, 3))


@pytest.mark.reliability
def test_sequence_longer_than_learned_positions(models):
    with pytest.raises(ValueError, match="sequence of length 129 is longer than the learned positions' max_len=128"):
        models["tiny-decoder-only"](torch.ones(1, 129, dtype=torch.long))


def test_mask_dtype_and_shape(models):
    model = models["tiny-decoder-only"]
    ids = torch.ones(2, 4, dtype=torch.long)
    with pytest.raises(TypeError, match="ids_mask must be a torch.bool tensor.*got torch.int64"):
        model(ids, torch.ones(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match=r"ids_mask must have shape \(2, 4\), got \(2, 5\)"):
        model(ids, torch.ones(2, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"ids must have shape \(B, T\), got shape \(4,\)"):
        model(torch.ones(4, dtype=torch.long))


def test_empty_batch_and_zero_length(models):
    """Documented: an empty batch or a zero-length sequence gives an empty output of the right shape."""
    ed = models["tiny-encoder-decoder"]
    assert ed(torch.zeros(0, 5, dtype=torch.long), torch.zeros(0, 3, dtype=torch.long)).shape == (0, 3, 64)
    assert ed(torch.ones(2, 5, dtype=torch.long), torch.zeros(2, 0, dtype=torch.long)).shape == (2, 0, 64)
    assert models["tiny-decoder-only"](torch.zeros(3, 0, dtype=torch.long)).shape == (3, 0, 64)
    assert models["tiny-encoder-only"](torch.zeros(0, 4, dtype=torch.long)).shape == (0, 4, 32)


@pytest.mark.reliability
def test_all_padding_source_gives_finite_output(models):
    """A source that is all padding: cross-attention rows are fully masked and give zeros, not NaN."""
    out = models["tiny-encoder-decoder"](torch.zeros(1, 4, dtype=torch.long), torch.tensor([[1, 7, 8]]))
    assert torch.isfinite(out).all()


def test_heads(models):
    bert = models["tiny-encoder-only"]
    hidden = bert(torch.randint(7, 64, (2, 5)))
    assert bert.masked_lm_logits(hidden).shape == (2, 5, 64)
    assert bert.classification_logits(hidden).shape == (2, 2)
    with pytest.raises(ValueError, match=r"segment_ids must be in \[0, n_segments=2\)"):
        bert(torch.randint(7, 64, (1, 3)), segment_ids=torch.tensor([[0, 1, 2]]))


def test_attention_maps(models):
    ed = models["tiny-encoder-decoder"]
    src, tgt = torch.tensor([[8, 9, 10, 0]]), torch.tensor([[1, 8, 9]])
    maps = ed.attention_maps(src, tgt)
    assert [w.shape for w in maps["encoder"]] == [(1, 4, 4, 4)] * 2
    assert [w.shape for w in maps["decoder_cross"]] == [(1, 4, 3, 4)] * 2
    # rows sum to one and never look at padding or the future
    torch.testing.assert_close(maps["decoder_self"][0].sum(-1), torch.ones(1, 4, 3))
    assert (maps["decoder_cross"][0][..., 3] == 0).all()
    assert (maps["decoder_self"][0].triu(1) == 0).all()


def test_logits_to_keep_projects_the_last_positions_only(models):
    """``logits_to_keep=n`` gives the last ``n`` positions' logits (a prompt generates from its last); 0 gives every
    position; anything but an int >= 0 is refused, naming the argument."""
    model = models["tiny-decoder-only"]
    ids = torch.randint(3, 64, (2, 7))
    every = model(ids)
    assert model(ids, logits_to_keep=0).shape == every.shape
    for keep in (1, 3, 7, 9):
        torch.testing.assert_close(model(ids, logits_to_keep=keep), every[:, -keep:], rtol=1e-5, atol=1e-5)
    for bad in (-1, 1.5, True, "1"):
        with pytest.raises(ValueError, match=r"logits_to_keep must be an int >= 0 \(0: every position\), got"):
            model(ids, logits_to_keep=bad)
