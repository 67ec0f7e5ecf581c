"""Invariances every correct Transformer has: causality, padding, batching, permutation."""

import pytest
import torch

from aiayn import build_model

POSITIONS = ["sinusoidal", "learned", "rotary", "alibi"]


def enc_dec(positions="sinusoidal", **kw):
    torch.manual_seed(0)
    return build_model("tiny-encoder-decoder", positions=positions, **kw).eval()


def gpt(positions="learned"):
    torch.manual_seed(0)
    return build_model("tiny-decoder-only", positions=positions).eval()


@pytest.mark.parametrize("positions", POSITIONS)
def test_decoder_is_causal(positions):
    model = enc_dec(positions)
    src, tgt = torch.randint(7, 64, (2, 6)), torch.randint(7, 64, (2, 8))
    changed = tgt.clone()
    changed[:, 5:] = torch.randint(7, 64, (2, 3))
    a, b = model(src, tgt), model(src, changed)
    torch.testing.assert_close(a[:, :5], b[:, :5], atol=1e-6, rtol=0)
    assert not torch.allclose(a[:, 5:], b[:, 5:])


@pytest.mark.parametrize("positions", POSITIONS)
def test_gpt_is_causal(positions):
    model = gpt(positions)
    ids = torch.randint(7, 64, (2, 9))
    changed = ids.clone()
    changed[:, 4] = (changed[:, 4] + 1 - 7) % 57 + 7
    a, b = model(ids), model(changed)
    torch.testing.assert_close(a[:, :4], b[:, :4], atol=1e-6, rtol=0)
    assert not torch.allclose(a[:, 4:], b[:, 4:])


@pytest.mark.parametrize("positions", POSITIONS)
def test_appending_padding_changes_nothing(positions):
    """Encoder self-, decoder self- and cross-attention all ignore padded keys."""
    model = enc_dec(positions)
    src, tgt = torch.randint(7, 64, (1, 5)), torch.randint(7, 64, (1, 4))
    pad = torch.zeros(1, 3, dtype=torch.long)  # PAD_ID = 0
    plain = model(src, tgt)
    padded = model(torch.cat([src, pad], 1), torch.cat([tgt, pad], 1))
    torch.testing.assert_close(padded[:, :4], plain, atol=1e-5, rtol=1e-5)
    memory = model.encode(src)
    memory_padded = model.encode(torch.cat([src, pad], 1))
    torch.testing.assert_close(memory_padded[:, :5], memory, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["tiny-decoder-only", "tiny-encoder-only"])
def test_padding_other_families(name):
    torch.manual_seed(0)
    model = build_model(name).eval()
    ids = torch.randint(7, 64, (1, 6))
    out = model(ids)
    out_padded = model(torch.cat([ids, torch.zeros(1, 2, dtype=torch.long)], 1))
    torch.testing.assert_close(out_padded[:, :6], out, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["tiny-encoder-decoder", "tiny-decoder-only", "tiny-encoder-only"])
def test_batch_equals_one_by_one(name):
    torch.manual_seed(0)
    model = build_model(name).eval()
    lengths = [6, 3, 5]
    rows = [torch.randint(7, 64, (n,)) for n in lengths]
    batch = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True)  # pads with 0 = PAD_ID
    if name == "tiny-encoder-decoder":
        out = model(batch, batch)
        singles = [model(r[None], r[None]) for r in rows]
    else:
        out = model(batch)
        singles = [model(r[None]) for r in rows]
    for i, (n, single) in enumerate(zip(lengths, singles)):
        torch.testing.assert_close(out[i, :n], single[0], atol=1e-5, rtol=1e-5)


def test_encoder_without_positions_is_permutation_equivariant_and_with_sinusoids_is_not():
    torch.manual_seed(0)
    src = torch.randint(7, 64, (1, 7))
    perm = torch.randperm(7)
    plain = enc_dec("none")
    torch.testing.assert_close(plain.encode(src[:, perm]), plain.encode(src)[:, perm], atol=1e-5, rtol=1e-5)
    with_pe = enc_dec("sinusoidal")
    assert not torch.allclose(with_pe.encode(src[:, perm]), with_pe.encode(src)[:, perm], atol=1e-3)


@pytest.mark.parametrize("positions", ["sinusoidal", "learned", "rotary", "alibi"])
@pytest.mark.parametrize("n_kv_heads", [None, 2, 1])
def test_cached_decoding_equals_full_pass(positions, n_kv_heads):
    model = enc_dec(positions, n_kv_heads=n_kv_heads)
    src = torch.cat([torch.randint(7, 64, (2, 6)), torch.zeros(2, 2, dtype=torch.long)], 1)
    src[1, 4:] = 0  # second row is shorter
    tgt = torch.randint(7, 64, (2, 5))
    full = model(src, tgt)
    memory, cache = model.encode(src), model.new_cache()
    src_mask = src != 0
    steps = [model.decode(tgt[:, i : i + 1], memory, src_mask=src_mask, cache=cache) for i in range(5)]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("positions", ["learned", "rotary", "alibi", "sinusoidal"])
def test_gpt_cache_equals_full_pass(positions):
    model = gpt(positions)
    ids = torch.randint(7, 64, (2, 7))
    full = model(ids)
    cache = model.new_cache(max_len=7)
    prefix = model(ids[:, :4], cache=cache)
    rest = [model(ids[:, i : i + 1], cache=cache) for i in range(4, 7)]
    torch.testing.assert_close(torch.cat([prefix, *rest], 1), full, atol=1e-5, rtol=1e-5)
