"""The static cache (preallocated buffers, through the model's own forward) gives the tokens and
logits of the growing cache, padded batches included. Compiled decoding (fp32 with packed Linear
layers, and int8) is a cell of tests/conformance, which compiles once for the whole matrix."""

import pytest
import torch
from decoding_helpers import gpt, random_rows

from aiayn.decoding import (
    BeamConfig,
    CausalLMDecoder,
    GenerationConfig,
    beam_search,
    generate,
    left_pad,
)
from aiayn.decoding.adapters import StaticState

CONFIG = GenerationConfig(max_new_tokens=8, greedy=True, eos_id=None)


@pytest.mark.parametrize("positions", ["learned", "sinusoidal", "rotary", "none"])
def test_static_equals_dynamic_cache_on_a_padded_batch(positions):
    model = gpt(positions)
    ids, mask = left_pad(random_rows([5, 2, 3]))
    dynamic, static = CausalLMDecoder(model), CausalLMDecoder(model, static_cache=True)
    state_d, logits_d = dynamic.start(ids, mask, max_new_tokens=4)
    state_s, logits_s = static.start(ids, mask, max_new_tokens=4)
    assert isinstance(state_s, StaticState) and state_s.cache.self_attn[0].k.shape[2] == 5 + 4
    for token in torch.tensor([[7, 8, 9], [10, 11, 12], [13, 14, 15]]):
        torch.testing.assert_close(logits_s, logits_d, rtol=1e-5, atol=1e-5)
        logits_d, logits_s = dynamic.step(token, state_d), static.step(token, state_s)
    torch.testing.assert_close(logits_s, logits_d, rtol=1e-5, atol=1e-5)


def test_beam_search_reorders_the_static_cache():
    model = gpt("rotary")
    ids, mask = left_pad(random_rows([4, 2]))
    config = BeamConfig(beam_size=3, max_new_tokens=6)
    assert beam_search(CausalLMDecoder(model, static_cache=True), ids, mask, config) == beam_search(CausalLMDecoder(model), ids, mask, config)


def test_alibi_takes_the_general_decoder_and_refuses_compile():
    model = gpt("alibi")
    ids, mask = left_pad(random_rows([4, 2]))
    assert torch.equal(generate(CausalLMDecoder(model, static_cache=True), ids, mask, CONFIG).tokens,
                       generate(CausalLMDecoder(model), ids, mask, CONFIG).tokens)
    with pytest.raises(ValueError, match="compile=True needs a static KV cache .* this model has positions='alibi': decode it without compile"):
        CausalLMDecoder(model, compile=True)


def _teacher_forced(decoder, ids, mask, feed, max_new_tokens):
    """Logits ``(STEPS + 1, B, V)``: after the prefill, then after feeding each row of ``feed (STEPS, B)``."""
    state, logits = decoder.start(ids, mask, max_new_tokens=max_new_tokens)
    return torch.stack([logits] + [decoder.step(token, state) for token in feed])


def test_static_cache_attends_over_the_filled_columns_only(monkeypatch):
    """Eagerly on the CPU a static cache hands attention only the columns filled so far; the path a compiled
    step traces (every column, the unfilled ones masked) gives the same logits."""
    import aiayn.nn.kernels as kernels

    widths = []
    attend = kernels.scaled_dot_product_attention

    def spy(q, k, v, **options):
        widths.append(k.shape[2])
        return attend(q, k, v, **options)

    monkeypatch.setattr(kernels, "scaled_dot_product_attention", spy)
    model = gpt("rotary")
    ids, mask = left_pad(random_rows([5, 2, 3]))
    feed = torch.tensor([[7, 8, 9], [10, 11, 12], [13, 14, 15]])
    filled = _teacher_forced(CausalLMDecoder(model, static_cache=True), ids, mask, feed, 8)
    assert widths == [width for width in (5, 6, 7, 8) for _ in range(model.config.n_layers)]
    widths.clear()
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)  # the traced path, run eagerly
    every_column = _teacher_forced(CausalLMDecoder(model, static_cache=True), ids, mask, feed, 8)
    assert set(widths) == {5 + 8}
    torch.testing.assert_close(every_column, filled, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_compiled_decoding_is_one_graph_for_every_length(monkeypatch):
    """One graph serves 40 steps and another prompt and max_new_tokens (the attended width and the buffers'
    length are dynamic), its guards look at layer 0 only (so their cost does not grow with the layers), and
    its logits are the eager static cache's, packed Linear layers included. One-query attention by our kernel where it
    builds (the backend timed fastest on an AMX Xeon), else by the formula (timed faster for bf16 on some CPUs);
    conformance compiles torch's fused kernel."""
    monkeypatch.setenv("AIAYN_COMPILE_WRAPPER", "python")  # one wrapper: timing both compiles a second graph
    from aiayn.decoding import adapters
    from aiayn.inference import gemv, pack_linears
    from aiayn.nn import attention

    kept = []
    keep_guards = adapters._step_guards

    def recording(entries):
        keep = keep_guards(entries)
        kept.extend(entry.name for entry, k in zip(entries, keep) if k)
        return keep

    monkeypatch.setattr(adapters, "_step_guards", recording)
    torch._dynamo.reset()  # forget graphs other tests compiled (they would count as recompilations here)
    model = gpt("rotary", n_layers=3)
    assert pack_linears(model) > 0  # as loading does: oneDNN's packed weights enter the frozen graph as constants
    backend = "native" if gemv.available() and gemv.may_run() else "math"
    monkeypatch.setattr(attention, "ONE_QUERY", {(torch.float32, m.n_heads, m.head_dim): backend for m in model.modules() if hasattr(m, "head_dim")})
    monkeypatch.setattr(attention, "FEW_QUERY", dict(attention.ONE_QUERY))  # a check's (and a short prompt's) too
    owner, name = (gemv, "attend_one") if backend == "native" else (attention, "_math_attention")
    kernel, one_query = getattr(owner, name), []
    monkeypatch.setattr(owner, name,  # recorded eagerly only (a list a graph appended to would be guarded on)
                        lambda q, *rest: (torch.compiler.is_compiling() or one_query.append(q.shape[2]), kernel(q, *rest))[1])
    compiled, eager = CausalLMDecoder(model, compile=True), CausalLMDecoder(model, static_cache=True)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for prompt_len, steps in [(4, 40), (7, 9)]:
            ids = torch.tensor(random_rows([prompt_len]))
            feed = torch.tensor(random_rows([steps], seed=prompt_len)[0])[:, None]  # (steps, 1), tokens as argmax gives them
            torch.testing.assert_close(_teacher_forced(compiled, ids, None, feed, steps + 2),
                                       _teacher_forced(eager, ids, None, feed, steps + 2), rtol=1e-4, atol=1e-4)
    # the eager decoder's steps took the chosen backend, and its prompts of 4 and 7 causal queries (at most FEW_QUERIES)
    assert set(one_query) == {1, 4, 7} and max(attention.FEW_QUERIES, 7) == attention.FEW_QUERIES
    assert any("_modules['0']" in name for name in kept) and any("self_attn[0]" in name for name in kept)
    assert not [name for name in kept if "_modules['1']" in name or "_modules['2']" in name or "self_attn[1]" in name]
    assert not torch._inductor.config.freezing  # switched on only while the step ran (a user's own compile is unaffected)
    with torch.no_grad():  # weights changed in place (a fine-tuning step): a new decoder sees them, packed ones included
        for param in model.parameters():
            param.mul_(1.5)
    ids = torch.tensor(random_rows([4]))
    feed = torch.tensor(random_rows([3], seed=9)[0])[:, None]
    torch.testing.assert_close(_teacher_forced(CausalLMDecoder(model, compile=True), ids, None, feed, 5),
                               _teacher_forced(CausalLMDecoder(model, static_cache=True), ids, None, feed, 5), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("method", ["int4", "int8-dynamic", "native"])
def test_compiled_decoding_through_other_kernels_gives_the_eager_logits(method, request):
    """int4's kernel lowers into the frozen graph (its packed codes as constants); int8-dynamic's FBGEMM matmul is an
    opaque op, packed before the step compiles; our native matrix-vector product (aiayn.inference.gemv) is an opaque
    op over the frozen fp32 weight. Each way the compiled step computes what the eager one does."""
    from aiayn.inference.precision import PackedLinear, replace_linears
    from aiayn.inference.quantization import quantize

    if method == "int4" and not hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu"):
        pytest.skip("no int4 CPU kernel in this torch")
    if method == "native":
        request.getfixturevalue("native_gemv")  # skips where it does not build
        model = gpt("rotary", n_layers=2)
        linears = [(n, m) for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
        model = replace_linears(model, linears, lambda name, linear: PackedLinear(linear, one="native", many="plain"))
    else:
        model = quantize(gpt("rotary", n_layers=2), method)
    ids = torch.tensor(random_rows([4]))
    feed = torch.tensor(random_rows([6], seed=4)[0])[:, None]
    torch.testing.assert_close(_teacher_forced(CausalLMDecoder(model, compile=True), ids, None, feed, 8),
                               _teacher_forced(CausalLMDecoder(model, static_cache=True), ids, None, feed, 8), rtol=1e-3, atol=1e-3)
