"""Every attention variant in every family it fits: cached decoding = uncached, a padded batch = its rows
alone, a fully padded row stays finite; the config refuses bad combinations naming the field."""

import pytest
import torch

from aiayn import build_model
from aiayn.decoding import CausalLMDecoder, Seq2SeqDecoder, left_pad, right_pad
from aiayn.interop.common import ConfigError
from aiayn.interop.hf import to_hf

VARIANTS = {
    "local": dict(attention="local", window=3),
    "linear": dict(attention="linear"),
    "ssm": dict(mixer="ssm"),
}
LENGTHS = [6, 2, 4]
STEPS = 5


def model(preset, variant, positions="sinusoidal"):
    torch.manual_seed(0)
    return build_model(preset, positions=positions, **VARIANTS[variant]).eval()


def rows(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(7, 64, (n,), generator=g).tolist() for n in lengths]


def teacher_forced(decoder, ids, mask, feed):
    """Logits ``(B, 1 + STEPS, V)``: after start, then after feeding each column of ``feed``."""
    state, logits = decoder.start(ids, mask, max_new_tokens=STEPS + 1)
    out = [logits]
    for i in range(feed.shape[1]):
        out.append(decoder.step(feed[:, i], state))
    return torch.stack(out, dim=1)


def decoders(preset, variant, positions):
    m = model(preset, variant, positions)
    if preset == "tiny-encoder-decoder":
        return lambda **kw: Seq2SeqDecoder(m, **kw), right_pad
    return lambda **kw: CausalLMDecoder(m, **kw), left_pad


CASES = [("tiny-decoder-only", v) for v in VARIANTS] + [("tiny-encoder-decoder", v) for v in ("local", "linear")]


@pytest.mark.parametrize("positions", ["sinusoidal", "rotary"])
@pytest.mark.parametrize("preset,variant", CASES)
def test_cached_equals_uncached_and_batch_equals_rows_alone(preset, variant, positions):
    make, pad = decoders(preset, variant, positions)
    ids, mask = pad(rows(LENGTHS))
    feed = torch.randint(7, 64, (3, STEPS), generator=torch.Generator().manual_seed(1))
    uncached = teacher_forced(make(use_cache=False), ids, mask, feed)
    cached = teacher_forced(make(), ids, mask, feed)
    torch.testing.assert_close(cached, uncached, atol=1e-5, rtol=0)
    for b, row in enumerate(rows(LENGTHS)):
        alone = teacher_forced(make(), torch.tensor([row]), None, feed[b : b + 1])
        torch.testing.assert_close(cached[b : b + 1], alone, atol=1e-5, rtol=0)


def cache_numel(cache) -> int:
    """How many numbers the layers' caches hold (ring buffers, linear states, SSM states alike)."""
    total = 0
    for layer in cache.self_attn:
        for value in vars(layer).values():
            for t in value if isinstance(value, tuple) else (value,):
                total += t.numel() if isinstance(t, torch.Tensor) else 0
    return total


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_generation_state_does_not_grow_with_the_context(variant):
    m = model("tiny-decoder-only", variant)
    cache = m.new_cache()
    with torch.no_grad():
        m(torch.randint(7, 64, (1, 20)), cache=cache)
        after_20 = cache_numel(cache)
        m(torch.randint(7, 64, (1, 30)), cache=cache)
        for _ in range(5):
            m(torch.randint(7, 64, (1, 1)), cache=cache)
    assert cache.length == 55 and cache_numel(cache) == after_20 > 0


@pytest.mark.parametrize("variant", ["local", "linear"])
def test_encoder_only_padded_batch_equals_rows_alone(variant):
    m = model("tiny-encoder-only", variant)
    ids, mask = right_pad(rows(LENGTHS))
    batched = m(ids, mask)
    for b, row in enumerate(rows(LENGTHS)):
        alone = m(torch.tensor([row]))
        torch.testing.assert_close(batched[b : b + 1, : len(row)], alone, atol=1e-5, rtol=0)


@pytest.mark.parametrize("preset,variant", CASES + [("tiny-encoder-only", "local"), ("tiny-encoder-only", "linear")])
def test_a_fully_padded_row_stays_finite(preset, variant):
    m = model(preset, variant).train()
    ids = torch.randint(7, 64, (2, 6))
    mask = torch.ones(2, 6, dtype=torch.bool)
    mask[1] = False
    if preset == "tiny-encoder-decoder":
        out = m(ids, ids, mask, mask)
    else:
        out = m(ids, mask)
    out.sum().backward()
    assert torch.isfinite(out).all()
    assert all(torch.isfinite(p.grad).all() for p in m.parameters() if p.grad is not None)


def test_attention_maps_local_shows_the_band_and_linear_says_why_not():
    m = model("tiny-decoder-only", "local")
    weights = m.attention_maps(torch.randint(7, 64, (1, 7)))["decoder_self"][0]  # (B, H, T, T)
    assert (weights[0, 0] > 0).sum(dim=1).tolist() == [1, 2, 3, 3, 3, 3, 3]
    with pytest.raises(ValueError, match="attention='linear' has no attention weights to return"):
        model("tiny-decoder-only", "linear").attention_maps(torch.randint(7, 64, (1, 7)))
    with pytest.raises(ValueError, match="mixer='ssm' has no attention weights"):
        model("tiny-decoder-only", "ssm").attention_maps(torch.randint(7, 64, (1, 7)))


@pytest.mark.parametrize(
    "overrides,message",
    [
        (dict(attention="local", window=0), "window=0 must be a positive integer"),
        (dict(attention="local", window=-3), "window=-3 must be a positive integer"),
        (dict(attention="local"), "window=None must be set with attention='local'"),
        (dict(window=8), "window=8 needs attention='local', got attention='softmax'"),
        (dict(attention="linear", window=8), "window=8 needs attention='local', got attention='linear'"),
        (dict(attention="sparse"), r"attention='sparse' must be one of \('softmax', 'local', 'linear'\)"),
        (dict(attention="local", window=4, positions="alibi"), "positions='alibi' adds a score bias"),
        (dict(attention="linear", attention_dropout=0.1), "attention_dropout=0.1 must be 0 with attention='linear'"),
        (dict(mixer="mamba"), r"mixer='mamba' must be one of \('attention', 'ssm'\)"),
        (dict(mixer="ssm", attention="linear"), "attention='linear' has no effect with mixer='ssm'"),
    ],
)
def test_bad_configs_name_the_field(overrides, message):
    with pytest.raises(ValueError, match=message):
        build_model("tiny-decoder-only", **overrides)


def test_ssm_is_for_decoder_only():
    for preset in ("tiny-encoder-only", "tiny-encoder-decoder"):
        with pytest.raises(ValueError, match="mixer='ssm' is for the decoder-only family"):
            build_model(preset, mixer="ssm")


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_hugging_face_export_refuses_naming_the_field(variant):
    field = "mixer" if variant == "ssm" else "attention"
    with pytest.raises(ConfigError, match=f"cannot export to Hugging Face: {field}="):
        to_hf(model("tiny-decoder-only", variant))


def test_config_round_trips_through_json():
    from aiayn.models import config_from_json

    config = model("tiny-decoder-only", "local").config
    assert config_from_json(config.to_json()) == config and config.window == 3
