"""One-query attention's backend chosen by timing (aiayn.inference.kernel_choice.choose_attention): cached per
machine beside the Linear choices, obeyed without timing again, the override obeyed and an unknown one named; the
``auto`` backend reads the choice only for one query at inference on the CPU, and decoding through either backend
gives the same tokens; where our kernel builds, it is a third candidate."""

import copy
import json
import logging

import pytest
import torch

from aiayn.inference import kernel_choice
from aiayn.nn import attention


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(kernel_choice, "_others_share", lambda start, end: 0.0)  # a quiet machine (the other test worker is not)
    monkeypatch.setenv(kernel_choice.ATTENTION_ENV_VAR, "measure")
    monkeypatch.setattr(attention, "ONE_QUERY", {})  # the process-wide tables, empty for this test and restored after
    monkeypatch.setattr(attention, "FEW_QUERY", {})
    return tmp_path / "aiayn" / "kernels.json"


@pytest.fixture
def two_backends(monkeypatch):
    """The candidates of a machine where our kernel does not build: torch's fused kernel and the formula."""
    monkeypatch.setattr(kernel_choice, "attention_candidates", lambda: ("sdpa", "math"))


def test_the_faster_backend_is_kept_per_dtype_and_shape_and_cached(cache, two_backends, monkeypatch, caplog):
    timings = {torch.float32: {"sdpa": 1.0, "math": 2.0}, torch.bfloat16: {"sdpa": 3.0, "math": 1.0}}
    calls = []
    monkeypatch.setattr(kernel_choice, "_time_attention", lambda dtype, heads, dim, names, queries: calls.append((dtype, heads, dim)) or timings[dtype])
    shapes = [(torch.bfloat16, 4, 16), (torch.float32, 4, 16), (torch.bfloat16, 4, 16)]
    with caplog.at_level(logging.INFO, logger="aiayn.inference.kernel_choice"):
        assert kernel_choice.choose_attention(shapes) == ["math", "sdpa", "math"]
    assert "attention 4x16 bfloat16 1 query (sdpa/math, cold, 16-key sums): sdpa 3.000, math 1.000 ms (1 query over 64+256+1024 keys) -> math" in caplog.text
    assert "$AIAYN_ATTENTION_KERNEL overrides" in caplog.text
    assert calls == [(torch.bfloat16, 4, 16), (torch.float32, 4, 16)]  # each shape timed once
    assert json.loads(cache.read_text())[kernel_choice.machine_key()] == {
        "attention 4x16 bfloat16 1 query (sdpa/math, cold, 16-key sums)": "math",
        "attention 4x16 float32 1 query (sdpa/math, cold, 16-key sums)": "sdpa"}
    monkeypatch.setattr(kernel_choice, "_time_attention", lambda *shape, names, queries: pytest.fail("timed a shape the cache decides"))
    assert kernel_choice.choose_attention(shapes[:2]) == ["math", "sdpa"]  # deterministic given the cache


def test_our_kernel_is_a_candidate_where_it_builds_and_an_older_choice_is_timed_again(native_gemv, cache, monkeypatch):
    """Where it builds, ``native`` is timed beside the other two and kept when fastest; a choice cached when only two
    were timed (or timed hot, or before our kernel summed 16 keys at a time) is timed again."""
    key = kernel_choice.machine_key()
    cache.parent.mkdir(parents=True)
    cache.write_text(json.dumps({key: {"attention 4x16 float32 1 query": "sdpa", "attention 4x16 float32 1 query (sdpa/math, cold)": "math",
                                       "attention 4x16 float32 1 query (sdpa/math/native, cold)": "sdpa"}}))
    timed = []
    monkeypatch.setattr(kernel_choice, "_time_attention",
                        lambda dtype, heads, dim, names, queries: timed.append(names) or {"sdpa": 2.0, "math": 3.0, "native": 1.0})
    assert kernel_choice.choose_attention([(torch.float32, 4, 16)]) == ["native"]
    assert timed == [("sdpa", "math", "native")]
    assert json.loads(cache.read_text())[key]["attention 4x16 float32 1 query (sdpa/math/native, cold, 16-key sums)"] == "native"


def test_real_timings_choose_a_backend_and_a_corrupt_cache_is_rebuilt(cache, two_backends, caplog):
    cache.parent.mkdir(parents=True)
    cache.write_text("[1, 2")
    with caplog.at_level(logging.WARNING, logger="aiayn.inference.kernel_choice"):
        (choice,) = kernel_choice.choose_attention([(torch.float32, 2, 8)])
    assert "corrupt kernel-choice cache" in caplog.text and choice in kernel_choice.ATTENTION
    assert json.loads(cache.read_text())[kernel_choice.machine_key()] == {"attention 2x8 float32 1 query (sdpa/math, cold, 16-key sums)": choice}


def test_the_override_is_obeyed_and_an_unknown_one_named(cache, monkeypatch):
    monkeypatch.setattr(kernel_choice, "_time_attention", lambda *shape, **names: pytest.fail("timed under an override"))
    for mode in kernel_choice.attention_candidates():
        monkeypatch.setenv(kernel_choice.ATTENTION_ENV_VAR, mode)
        assert kernel_choice.choose_attention([(torch.float32, 2, 8)]) == [mode]
    monkeypatch.setenv(kernel_choice.ATTENTION_ENV_VAR, "flash")
    with pytest.raises(ValueError, match=r"\$AIAYN_ATTENTION_KERNEL must be one of measure, sdpa, math, native, got 'flash'"):
        kernel_choice.choose_attention([(torch.float32, 2, 8)])
    monkeypatch.setenv(kernel_choice.ATTENTION_ENV_VAR, "native")  # where our kernel cannot run: said, with the reason
    monkeypatch.setattr(kernel_choice, "gemv_available", lambda: False)
    monkeypatch.setattr(kernel_choice, "unavailable_reason", lambda: "no C++ compiler")
    with pytest.raises(ValueError, match=r"\$AIAYN_ATTENTION_KERNEL=native: our one-query kernel cannot run here \(no C\+\+ compiler\)"):
        kernel_choice.choose_attention([(torch.float32, 2, 8)])


def test_auto_reads_the_choice_only_for_one_query_at_inference_on_the_cpu(cache):
    attention.ONE_QUERY[(torch.float32, 2, 8)] = "math"
    one, two = torch.randn(1, 2, 1, 8), torch.randn(1, 2, 2, 8)
    assert attention.resolve_backend("auto", one, 5) == "math"
    assert attention.resolve_backend("sdpa", one, 5) == "sdpa"  # a named backend is obeyed
    assert attention.resolve_backend("auto", two, 5) == "sdpa"  # a prompt: several queries
    assert attention.resolve_backend("auto", torch.randn(1, 4, 1, 8), 5) == "sdpa"  # a shape not timed
    assert attention.resolve_backend("auto", one.requires_grad_(), 5) == "sdpa"  # training


def test_a_check_reads_its_own_choice_timed_at_its_queries(cache, two_backends, monkeypatch):
    """A few causal queries (speculative decoding's check) take the choice timed at FEW_QUERIES causal queries, cached
    under its own name, and the one-query choice where that shape has none; an encoder (which never checks drafts)
    times one query only."""
    from aiayn import build_model

    calls = []
    monkeypatch.setattr(kernel_choice, "_time_attention", lambda dtype, heads, dim, names, queries: calls.append(queries)
                        or ({"sdpa": 1.0, "math": 2.0} if queries == 1 else {"sdpa": 2.0, "math": 1.0}))
    encoder = build_model("tiny-encoder-only", vocab_size=40, n_heads=2)  # two heads of 16
    assert kernel_choice.choose_model_attention(encoder) == {(torch.float32, 2, 16): "sdpa"}
    assert calls == [1] and attention.FEW_QUERY == {}
    calls.clear()
    model = build_model("tiny-decoder-only", vocab_size=40, d_model=8, n_heads=2)  # two heads of 4
    assert kernel_choice.choose_model_attention(model) == {(torch.float32, 2, 4): "sdpa"}
    assert calls == [1, attention.FEW_QUERIES] and attention.FEW_QUERY == {(torch.float32, 2, 4): "math"}
    assert json.loads(cache.read_text())[kernel_choice.machine_key()][
        f"attention 2x4 float32 {attention.FEW_QUERIES} causal queries (sdpa/math, cold, 16-key sums)"] == "math"
    one, check = torch.randn(1, 2, 1, 4), torch.randn(1, 2, attention.FEW_QUERIES, 4)
    assert attention.resolve_backend("auto", one, 9) == "sdpa"
    assert attention.resolve_backend("auto", check, 9, causal=True) == "math"
    assert attention.resolve_backend("auto", check, 9) == "sdpa"  # not causal: not a check
    attention.FEW_QUERY.clear()
    assert attention.resolve_backend("auto", check, 9, causal=True) == "sdpa"  # no check choice: the one-query one


def test_decoding_through_either_backend_gives_the_same_tokens(cache, monkeypatch):
    """A model loaded as aiayn.load does registers its shape; greedy decoding with one-query attention by the formula
    (and by our kernel, where it builds) gives the tokens of torch's fused kernel, for the decoder-only and the
    encoder-decoder families, grouped-query heads and local attention's ring buffer."""
    from aiayn import build_model
    from aiayn.decoding import CausalLMDecoder, GenerationConfig, as_decoder, generate
    from aiayn.models.decoder_only import DecoderOnly
    from aiayn.pretrained import prepare_for_inference

    monkeypatch.setattr(kernel_choice, "_time_attention", lambda *shape, names, queries: {"sdpa": 2.0, "math": 1.0, "native": 3.0})
    formula, one_query = attention._math_attention, []
    monkeypatch.setattr(attention, "_math_attention", lambda q, *rest: one_query.append(q.shape[2] <= attention.FEW_QUERIES) or formula(q, *rest))
    ours, native_calls = attention.gemv.attend_one, []
    monkeypatch.setattr(attention.gemv, "attend_one", lambda *args: native_calls.append(1) or ours(*args))
    config = GenerationConfig(max_new_tokens=10, greedy=True, eos_id=None)
    variants = [("tiny-decoder-only", {}), ("tiny-encoder-decoder", {}), ("tiny-decoder-only", {"n_kv_heads": 1}),
                ("tiny-decoder-only", {"attention": "local", "window": 4})]  # grouped-query heads; a ring buffer's keys
    for preset, overrides in variants:
        torch.manual_seed(0)
        model = prepare_for_inference(build_model(preset, vocab_size=40, **overrides), pack=False)
        heads = {(m.n_heads, m.head_dim) for m in model.modules() if hasattr(m, "head_dim")}
        assert {(h, d) for (_, h, d), b in attention.ONE_QUERY.items() if b == "math"} == heads
        assert attention.FEW_QUERY == attention.ONE_QUERY  # a check's choice too, timed apart
        prompt = torch.randint(4, 40, (2, 6))
        tokens = {}
        for backend in kernel_choice.attention_candidates():  # ours too where it builds
            for key in attention.ONE_QUERY:
                attention.ONE_QUERY[key] = attention.FEW_QUERY[key] = backend
            one_query.clear()
            native_calls.clear()
            # decoder-only models through the model's forward, whose attention calls are counted here (the C++ step
            # takes the same choice: tests/decoding/test_native_step.py)
            decoder = copy.deepcopy(model)
            decoder = CausalLMDecoder(decoder, native=False) if isinstance(decoder, DecoderOnly) else as_decoder(decoder)
            tokens[backend] = generate(decoder, prompt, None, config).sequences()
            # the formula: decoding steps (and a decoder-only prompt of 6 causal queries, at most FEW_QUERIES) only
            assert any(one_query) == (backend == "math") and not any(not q for q in one_query)
            assert bool(native_calls) == (backend == "native")
        assert all(t == tokens["sdpa"] for t in tokens.values())
