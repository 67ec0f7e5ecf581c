"""The one-token step in C++ (aiayn.decoding.native_step) gives the eager step's logits, for every layer kind it
takes, and leaves every other model to the eager step."""

import pytest
import torch
from decoding_helpers import gpt, random_rows

from aiayn.decoding import BeamConfig, CausalLMDecoder, GenerationConfig, SpeculativeDecoder, beam_search, generate, left_pad
from aiayn.decoding.adapters import _decode_one, auto_kv_dtype
from aiayn.decoding.native_step import NativeStep, native_step_blocker
from aiayn.inference import kernel_choice
from aiayn.inference.int4 import Int4Linear
from aiayn.inference.precision import PackedLinear
from aiayn.inference.quantization import Int8Linear
from aiayn.nn import attention
from aiayn.nn.norm import NativeLayerNorm, NativeRMSNorm
from aiayn.pretrained import prepare_for_inference

FEED = torch.tensor([[7, 8, 9], [10, 11, 12], [13, 14, 15], [16, 17, 18]])  # (STEPS, B): tokens fed after the prefill


def _loaded(dtype=None, quantize=None, **overrides):
    """A tiny decoder-only model prepared as aiayn.load prepares one (Q/K/V fused, cast, kernels chosen)."""
    return prepare_for_inference(gpt(**overrides), dtype=dtype, quantize=quantize)


def _kernels(model, one, many="packed", int8="native", int8_many="torch", int8_prompt="torch"):
    """Every floating-point Linear's one-row and several-row kernel, and every int8 or int4 layer's (and its kernel of a
    prompt's rows), set by hand."""
    for module in model.modules():
        if isinstance(module, PackedLinear):
            module.one, module.many = one, many
            module.refresh()
        elif isinstance(module, (Int8Linear, Int4Linear)):
            module.one, module.many, module.prompt = int8, int8_many, int8_prompt


def _teacher_forced(decoder, ids, mask):
    """Logits ``(B, 8, V)``: after the prefill, after feeding each row of FEED one step at a time, then of three tokens
    fed at once (``extend``, speculative decoding's check)."""
    state, logits = decoder.start(ids, mask, max_new_tokens=len(FEED) + 3)
    steps = torch.stack([logits] + [decoder.step(token[: ids.shape[0]], state) for token in FEED], dim=1)
    return torch.cat([steps, decoder.extend(FEED[:3, : ids.shape[0]].T, state)], dim=1)


def _assert_same_logits(model, tolerance=0.0, *, every_batch_kind=True):
    """The C++ step against the model's forward, over the static and the growing cache, a left-padded batch of three and
    one row (``every_batch_kind``: the C++ step ran for both, none of them falling back to the forward)."""
    for static in (True, False):
        for lengths in ([5, 2, 3], [4]):
            ids, mask = left_pad(random_rows(lengths))
            native, eager = CausalLMDecoder(model, static_cache=static), CausalLMDecoder(model, static_cache=static, native=False)
            assert isinstance(native._native, NativeStep) and eager._native is None and eager._step is _decode_one
            got, want = _teacher_forced(native, ids, mask), _teacher_forced(eager, ids, mask)
            torch.testing.assert_close(got, want, rtol=tolerance, atol=tolerance)
            assert not every_batch_kind or all(plan is not None for plan in native._native._plans.values())


@pytest.mark.parametrize("positions", ["learned", "rotary"])
@pytest.mark.parametrize("dtype", [None, "bfloat16"])
@pytest.mark.parametrize("one", ["native", "native-prefetch", "plain", "packed"])
def test_gpt2_like_layers_give_the_eager_logits(native_gemv, monkeypatch, dtype, one, positions):
    """Pre-LN, learned positions (or rotary: the query and the new key rotated in C++), GPT-2's GELU through our kernel,
    our one-query attention, each one-row Linear kernel."""
    monkeypatch.setattr(kernel_choice, "choose_gelu_tanh", lambda dtype: "native")
    model = _loaded(dtype, activation="gelu_tanh", positions=positions)
    _kernels(model, one)
    monkeypatch.setitem(attention.ONE_QUERY, (model.embed.weight.dtype, 4, 8), "native")
    _assert_same_logits(model)


@pytest.mark.parametrize("dtype", [None, "bfloat16"])
@pytest.mark.parametrize("activation", ["relu", "relu2"])
def test_activations_in_our_products_epilogue_give_the_eager_logits(native_gemv, monkeypatch, dtype, activation):
    """ReLU (the paper's) and ReLU squared (the speedrun's) applied as our kernel writes the feed-forward's first product
    (gemv_activation), and the residual adds in its epilogue (gemv_add_): the eager logits bit for bit."""
    model = _loaded(dtype, activation=activation, positions="rotary")
    _kernels(model, "native")
    monkeypatch.setitem(attention.ONE_QUERY, (model.embed.weight.dtype, 4, 8), "native")
    _assert_same_logits(model)


@pytest.mark.parametrize(("overrides", "backend"), [
    ({"norm_position": "post", "positions": "sinusoidal", "activation": "relu"}, "sdpa"),  # the paper's layer
    ({"norm": "rmsnorm", "activation": "swiglu", "n_kv_heads": 2, "positions": "rotary", "bias": False}, "math"),  # Llama-like
    ({"activation": "gelu", "n_kv_heads": 1, "bias": False, "positions": "rotary"}, "sdpa"),  # multi-query, no biases
    ({"activation": "silu", "positions": "none"}, "native"),
    ({"activation": "relu2", "n_kv_heads": 2}, "native"),
    ({"activation": "relu2", "norm": "rmsnorm", "qk_norm": True, "positions": "rotary", "n_kv_heads": 2}, "native"),  # speedrun-like
    ({"qk_norm": True, "positions": "learned"}, "sdpa"),
])
def test_other_layer_kinds_give_the_eager_logits(native_gemv, monkeypatch, overrides, backend):
    model = _loaded(**overrides)
    monkeypatch.setitem(attention.ONE_QUERY, (torch.float32, 4, 8), backend)
    _assert_same_logits(model, tolerance=1e-6)


@pytest.mark.parametrize("kernel", ["torch", "native"])
@pytest.mark.parametrize("dtype", [None, "bfloat16"])
@pytest.mark.parametrize("overrides", [
    {"bias": False},  # LayerNorm without its additive term
    {"activation": "relu2", "norm": "rmsnorm", "qk_norm": True, "positions": "rotary"},  # RMSNorm, and per head (QK norm)
])
def test_either_norm_kernel_gives_the_eager_logits(native_gemv, monkeypatch, kernel, dtype, overrides):
    monkeypatch.setattr(kernel_choice, "_NATIVE_CHOSEN", {("norm", torch.float32): kernel, ("norm", torch.bfloat16): kernel})
    model = _loaded(dtype, **overrides)
    natives = sum(isinstance(m, (NativeLayerNorm, NativeRMSNorm)) for m in model.modules())
    assert natives == (0 if kernel == "torch" else 2 * 2 + 1 + 2 * 2 * int("qk_norm" in overrides))  # 2 layers, final norm
    _assert_same_logits(model)


@pytest.mark.parametrize("dtype", [None, "bfloat16"])
@pytest.mark.parametrize("overrides", [{}, {"activation": "relu2", "norm": "rmsnorm", "qk_norm": True, "positions": "rotary", "n_kv_heads": 2}])
def test_a_check_of_several_tokens_gives_the_one_token_steps_logits(native_gemv, monkeypatch, dtype, overrides):
    """Speculative decoding's check through our kernels (a few rows of each Linear layer, the norms, a few causal
    queries) computes each position as the one-token step there does: the same logits bit for bit, so greedy decoding
    with drafts is plain greedy decoding by construction, not by a margin."""
    model = _loaded(dtype, **overrides)
    _kernels(model, "native", many="native")
    monkeypatch.setitem(attention.ONE_QUERY, (model.embed.weight.dtype, 4, 8), "native")
    monkeypatch.setitem(attention.FEW_QUERY, (model.embed.weight.dtype, 4, 8), "native")
    ids, feed = torch.tensor(random_rows([5])), torch.tensor([[7, 8, 9, 10]])
    decoder = CausalLMDecoder(model, static_cache=True)
    state, _ = decoder.start(ids, None, max_new_tokens=8)
    checked = decoder.extend(feed, state)  # (1, 4, V): one forward of the four tokens
    state, _ = decoder.start(ids, None, max_new_tokens=8)
    stepped = torch.stack([decoder.step(feed[:, i], state) for i in range(feed.shape[1])], dim=1)
    assert torch.equal(checked, stepped)


@pytest.mark.parametrize("dtype", [None, "bfloat16"])
@pytest.mark.parametrize("many", ["native", "native-prefetch"])
def test_several_rows_through_our_kernel_give_the_eager_logits(native_gemv, dtype, many):
    """Several rows through our kernel: the steps of three rows up to gemv.FEW_ROWS, the check of three tokens a row
    (nine rows) and the prompt beyond it through oneDNN's packed weight, as the eager forward takes them."""
    model = _loaded(dtype)
    _kernels(model, "native", many=many)
    _assert_same_logits(model)


@pytest.mark.parametrize(("quantize", "int8", "int8_many", "prompt"), [
    ("int8", "native", "torch", "torch"), ("int8", "torch", "torch", "torch"), ("int8", "native-prefetch", "native", "torch"),
    ("int8", "torch", "native-prefetch", "torch"), ("int8", "torch", "torch", "dequant"), ("int8", "native", "native-prefetch", "dequant"),
    ("int4", None, None, None), ("int4", "native", "torch", "torch"), ("int4", "native-prefetch", "native", "torch"),
    ("int4", "torch", "torch", "dequant"), ("int4", "native", "native", "dequant")])
def test_quantised_layers_give_the_eager_logits(native_gemv, quantize, int8, int8_many, prompt):
    """int8 and int4 several rows through ours: the steps of three rows and the check of three tokens a row (nine rows: more
    than gemv.FEW_ROWS, so the prompt kernel: torch's or the widened weight) and the prompt each take the kernel the
    eager forward takes."""
    model = _loaded(quantize=quantize, d_model=64, d_ff=128)  # int4 groups of 32 inputs
    if int8 is not None:
        _kernels(model, "packed", int8=int8, int8_many=int8_many, int8_prompt=prompt)
    _assert_same_logits(model)


@pytest.mark.parametrize("static", [True, False])
@pytest.mark.parametrize("attend", ["native", "sdpa"])
@pytest.mark.parametrize("overrides", [{"positions": "learned"}, {"positions": "rotary", "n_kv_heads": 2, "norm": "rmsnorm"}])
def test_a_bf16_cache_under_fp32_activations_gives_the_eager_logits(native_gemv, monkeypatch, attend, overrides, static):
    """kv_dtype=bfloat16, static or growing cache: the C++ step writes the keys and values rounded to bf16 as the
    forward's write into the cache does, and reads them widened (our kernel) or converted (torch's) as the forward does,
    so the same logits and the same cache bit for bit, over the prompt, the steps and a check of three tokens; near the
    fp32 cache's logits."""
    model = _loaded(**overrides)
    for table in (attention.ONE_QUERY, attention.FEW_QUERY):
        monkeypatch.setitem(table, (torch.float32, 4, 8), attend)
    ids, mask = left_pad(random_rows([5, 2, 3]))
    native = CausalLMDecoder(model, static_cache=static, kv_dtype=torch.bfloat16)
    eager = CausalLMDecoder(model, static_cache=static, native=False, kv_dtype=torch.bfloat16)
    got, want = _teacher_forced(native, ids, mask), _teacher_forced(eager, ids, mask)
    assert torch.equal(got, want) and all(plan is not None for plan in native._native._plans.values())
    (state, _), (eager_state, _) = native.start(ids, mask, max_new_tokens=4), eager.start(ids, mask, max_new_tokens=4)
    for token in FEED[:2]:
        native.step(token[:3], state)
        eager.step(token[:3], eager_state)
    for layer, eager_layer in zip(state.cache.self_attn, eager_state.cache.self_attn):
        assert layer.k.dtype == layer.v.dtype == torch.bfloat16 and layer.k.shape == eager_layer.k.shape
        assert torch.equal(layer.k, eager_layer.k) and torch.equal(layer.v, eager_layer.v)
    wide = _teacher_forced(CausalLMDecoder(model, static_cache=static), ids, mask)
    torch.testing.assert_close(got, wide, rtol=0.05, atol=0.05)  # bf16 keys and values: about 3 significant digits
    assert not torch.equal(got, wide)  # the bf16 cache was read


def test_a_cache_dtype_is_refused_where_it_cannot_apply(native_gemv):
    model = _loaded()
    with pytest.raises(ValueError, match=r"kv_dtype=torch.float16: a KV cache keeps keys and values in one of torch.float32, torch.bfloat16"):
        CausalLMDecoder(model, static_cache=True, kv_dtype=torch.float16)
    for options, why in (({"compile": True}, "compile=True"), ({"use_cache": False}, "use_cache=False")):
        with pytest.raises(ValueError, match=rf"kv_dtype=torch.bfloat16 is the KV cache's, decoded without compile; got {why}"):
            CausalLMDecoder(model, kv_dtype=torch.bfloat16, **options)


def test_kv_dtype_auto_keeps_int8_and_int4_models_caches_in_bf16(native_gemv):
    """kv_dtype="auto" (the CLI's, the server's and aiayn.load's default): bf16 for weight-only int8 and int4 layers under
    fp32 activations; the activations' dtype for fp32 and bf16 weights, bf16 activations, int8-dynamic layers (an
    Int8Linear that is not weight-only), compile and no cache."""
    ids, mask = left_pad(random_rows([3, 2]))
    for quantize, dtype, want in ((None, None, None), ("int8", None, torch.bfloat16), ("int4", None, torch.bfloat16),
                                  ("int8", "bfloat16", None), (None, "bfloat16", None), ("int8-dynamic", None, None)):
        model = _loaded(dtype=dtype, quantize=quantize)
        decoder = CausalLMDecoder(model, static_cache=True, kv_dtype="auto")
        assert auto_kv_dtype(model) == decoder.kv_dtype == want, (quantize, dtype)
        state, _ = decoder.start(ids, mask, max_new_tokens=2)
        written = {want or (torch.bfloat16 if dtype else torch.float32)}
        assert {t.dtype for layer in state.cache.self_attn for t in (layer.k, layer.v)} == written, (quantize, dtype)
    assert CausalLMDecoder(model, use_cache=False, kv_dtype="auto").kv_dtype is None
    with pytest.raises(ValueError, match=r"kv_dtype='bf16': a KV cache keeps .* None \(the activations' dtype\) or 'auto'"):
        CausalLMDecoder(model, kv_dtype="bf16")  # a name, not a dtype: the entry points parse names


@pytest.mark.parametrize("static", [True, False])
@pytest.mark.parametrize("dtype", [None, torch.bfloat16])
def test_the_prefill_runs_through_the_cpp_step_and_writes_the_forwards_cache(native_gemv, monkeypatch, dtype, static):
    """A prompt goes through the C++ step (the static cache's buffers allocated first, the growing cache's empty tensors,
    as the forward's first write would): the same logits and the same keys and values, bit for bit, as the forward. Both
    project the last position only (the only one a prompt generates from)."""
    model = _loaded(dtype=dtype, activation="gelu_tanh")
    decoder = CausalLMDecoder(model, static_cache=static)
    calls = []
    run = decoder._native._run
    monkeypatch.setattr(decoder._native, "_run", lambda model, tokens, *rest: calls.append((tuple(tokens.shape), rest[-1])) or run(model, tokens, *rest))
    ids, mask = left_pad(random_rows([5, 2]))
    state, logits = decoder.start(ids, mask, max_new_tokens=3)
    assert calls == [(tuple(ids.shape), 1)] and decoder._native._plans[False] is not None  # the plan of several rows ran
    projected = []
    hook = model.output.register_forward_hook(lambda module, args, out: projected.append(tuple(args[0].shape)))
    try:
        eager_state, eager_logits = CausalLMDecoder(model, static_cache=static, native=False).start(ids, mask, max_new_tokens=3)
    finally:
        hook.remove()
    assert projected == [(2, 1, model.config.d_model)]  # the forward projected the last position alone
    assert torch.equal(logits, eager_logits)
    for got, want in zip(state.cache.self_attn, eager_state.cache.self_attn):
        assert got.k.dtype == want.k.dtype and torch.equal(got.k, want.k) and torch.equal(got.v, want.v)
        assert got.length == want.length == ids.shape[1]


@pytest.mark.parametrize("static", [True, False])
@torch.no_grad()
def test_logits_to_keep_cuts_the_steps_projection_as_the_forward_cuts_it(native_gemv, static):
    """The C++ step's logits of the last ``keep`` positions of a prompt are the forward's with ``logits_to_keep=keep``,
    bit for bit, and every position's cut there (within fp32 rounding: other row counts, other kernels' blocking)."""
    model = _loaded(activation="gelu_tanh")
    ids = torch.tensor(random_rows([6, 6]))
    for keep in (1, 2, 6):
        caches = []
        for _ in range(2):
            cache = model.new_cache(max_len=8) if static else model.new_cache()
            CausalLMDecoder(model, static_cache=static)._prefill(ids[:, :1], None, cache, 0)  # allocated, one position in
            caches.append(cache)
        got, best = CausalLMDecoder(model, static_cache=static)._native._run(model, ids[:, 1:], caches[0], None, 1, keep)
        want = model(ids[:, 1:], cache=caches[1], offset=1, logits_to_keep=keep)
        assert got.shape == (2, min(keep, 5), model.config.vocab_size) and torch.equal(got, want)
        torch.testing.assert_close(got, model(ids)[:, 1:][:, -keep:], rtol=1e-5, atol=1e-5)
        assert best is None or keep == 1


def test_greedy_generation_gives_the_eager_tokens(native_gemv):
    model = _loaded(activation="gelu_tanh")
    ids, mask = left_pad(random_rows([6, 3]))
    config = GenerationConfig(max_new_tokens=12, greedy=True, eos_id=None)
    native = generate(CausalLMDecoder(model, static_cache=True), ids, mask, config).tokens
    assert torch.equal(native, generate(CausalLMDecoder(model, static_cache=True, native=False), ids, mask, config).tokens)


@pytest.mark.parametrize(("overrides", "reason"), [
    ({"positions": "alibi"}, "alibi positions"),
    ({"attention": "local", "window": 4}, "layer 0: local attention"),
    ({"attention": "linear"}, "layer 0: linear attention"),
    ({"mixer": "ssm"}, "layer 0: a state-space mixer"),
])
def test_other_models_keep_the_eager_step(native_gemv, overrides, reason):
    model = _loaded(**overrides)
    assert native_step_blocker(model).startswith(reason)
    assert CausalLMDecoder(model, static_cache=True)._step is _decode_one and CausalLMDecoder(model)._native is None


def test_a_model_not_prepared_for_inference_keeps_the_eager_step(native_gemv):
    model = gpt()
    assert "not fused" in native_step_blocker(model)
    assert native_step_blocker(model.train()) == "a model in training mode"


def test_a_linear_kind_it_does_not_know_keeps_the_eager_step_for_that_batch_kind(native_gemv):
    model = _loaded()
    _kernels(model, "split")  # one row through the split kernel: not a kind of the C++ step; several rows packed
    _assert_same_logits(model, every_batch_kind=False)
    decoder = CausalLMDecoder(model, static_cache=True)
    _teacher_forced(decoder, *left_pad(random_rows([4])))
    _teacher_forced(decoder, *left_pad(random_rows([4, 2])))
    assert decoder._step._plans[True] is None and decoder._step._plans[False] is not None


def test_a_model_switched_to_training_takes_the_eager_step(native_gemv):
    model = _loaded()
    decoder = CausalLMDecoder(model, static_cache=True)
    ids, mask = left_pad(random_rows([4]))
    state, logits = decoder.start(ids, mask, max_new_tokens=3)
    model.train()
    with torch.no_grad():
        want = model(FEED[0, :1, None], None, cache=state.cache, offset=state.column - state.pads)[:, -1]
    model.eval()
    state.cache.crop(int(state.column))  # the column the check wrote, written again
    model.train()
    torch.testing.assert_close(decoder.step(FEED[0, :1], state), want)


def test_stepping_past_the_static_cache_names_its_length(native_gemv):
    model = _loaded()
    decoder = CausalLMDecoder(model, static_cache=True)
    ids, mask = left_pad(random_rows([4]))
    state, logits = decoder.start(ids, mask, max_new_tokens=1)  # 5 columns: the prompt and one token
    decoder.step(FEED[0, :1], state)
    with pytest.raises(ValueError, match="static cache holds max_len=5 positions, asked for 6"):
        decoder.step(FEED[1, :1], state)


def test_the_step_embeds_and_projects_and_refuses_what_the_model_refuses(native_gemv):
    """A GPT-2-like model's step takes the ids and gives the logits (no Python between); ids outside the vocabulary and
    positions past the learned table get the model's own errors, before any cache column is written."""
    model = _loaded(max_len=6)
    decoder = CausalLMDecoder(model, static_cache=True)
    ids, mask = left_pad(random_rows([4]))
    state, _ = decoder.start(ids, mask, max_new_tokens=2)  # 6 columns, all the learned positions
    decoder.step(FEED[0, :1], state)
    assert decoder._native._plans[True][1:] == (True, True)  # it embeds, it projects
    column = int(state.column)
    for bad, words in ((model.config.vocab_size, "outside the vocabulary of vocab_size="), (-1, "negative token id -1")):
        with pytest.raises(ValueError, match=words):
            decoder.step(torch.tensor([bad]), state)
        assert int(state.column) == column
        state.crop(column)
    past = (FEED[1, :1, None], state.cache, None, torch.tensor([6]))
    with pytest.raises(ValueError, match="sequence of length 7 is longer than the learned positions' max_len=6"):
        model(past[0], cache=past[1], offset=past[3])
    with pytest.raises(ValueError, match="sequence of length 7 is longer than the learned positions' max_len=6"):
        decoder._native.logits(model, *past)
    assert int(state.column) == column


@pytest.mark.parametrize("dtype", [None, torch.bfloat16])
def test_greedy_takes_the_argmax_the_step_made_of_these_logits_only(native_gemv, dtype):
    """The step's argmax of the logits it returns (fp32, or a bf16 model's bf16) is greedy's pick of them (the same index
    as argmax), and of nothing else: not of a copy, not after the logits change in place."""
    from aiayn.decoding import sampling

    decoder = CausalLMDecoder(_loaded(dtype=dtype), static_cache=True)
    ids, mask = left_pad(random_rows([4, 2]))
    state, _ = decoder.start(ids, mask, max_new_tokens=3)
    logits = decoder.step(FEED[0, :2], state)
    best = sampling.argmax_last(logits)
    assert best is sampling._REMEMBERED[2] and torch.equal(best, logits.argmax(dim=-1))
    copy = logits.clone()
    assert sampling.argmax_last(copy) is not best and torch.equal(sampling.argmax_last(copy), best)
    assert (best != 0).all()
    logits[:, 0] = logits.max() + 1  # in place: the remembered pick no longer holds
    assert torch.equal(sampling.argmax_last(logits), torch.zeros(2, dtype=torch.long))
    logits = decoder.step(FEED[1, :2], state)  # greedy's pick through next_token: no fp32 copy of bf16 logits first
    config = GenerationConfig(greedy=True)
    assert sampling.next_token(logits, state, torch.zeros(2, dtype=torch.long), config) is sampling._REMEMBERED[2]
    assert torch.equal(sampling._REMEMBERED[2], logits.float().argmax(dim=-1))


def test_int8_dynamic_layers_keep_the_eager_step(native_gemv):
    """Int8DynamicLinear is an Int8Linear that quantises its input too: not the kind the C++ step computes."""
    model = _loaded(quantize="int8-dynamic", d_model=64, d_ff=128)
    decoder = CausalLMDecoder(model, static_cache=True)
    ids, mask = left_pad(random_rows([4]))
    got = _teacher_forced(decoder, ids, mask)
    torch.testing.assert_close(got, _teacher_forced(CausalLMDecoder(model, static_cache=True, native=False), ids, mask), rtol=0, atol=0)
    assert decoder._step._plans == {True: None, False: None}


@pytest.mark.parametrize("static", [True, False])
def test_beam_search_and_speculative_decoding_give_the_eager_output(native_gemv, static):
    """Beam search reorders the caches between its C++ steps; speculative decoding (its checks through the model's
    forward) crops caches the C++ step may have written."""
    model = _loaded(positions="rotary")
    ids, mask = left_pad(random_rows([5, 3]))
    native, eager = CausalLMDecoder(model, static_cache=static), CausalLMDecoder(model, static_cache=static, native=False)
    config = BeamConfig(beam_size=3, max_new_tokens=6)
    assert beam_search(native, ids, mask, config) == beam_search(eager, ids, mask, config)
    assert native._native._plans.get(False) is not None  # the beams' steps ran in C++
    prompt = torch.tensor([[7, 8, 9, 10, 7, 8, 9, 10, 7, 8]])  # repeats: prompt lookup drafts from it
    greedy = GenerationConfig(max_new_tokens=10, greedy=True, eos_id=None)
    got = generate(SpeculativeDecoder(native, draft_tokens=3), prompt, None, greedy).tokens
    assert torch.equal(got, generate(SpeculativeDecoder(eager, draft_tokens=3), prompt, None, greedy).tokens)
    assert torch.equal(got, generate(CausalLMDecoder(model, static_cache=static, native=False), prompt, None, greedy).tokens)
