"""Greedy decoding and sampling: per-row stopping, reproducibility, and the math of each processor."""

import math
from dataclasses import replace

import pytest
import torch
from decoding_helpers import A, B, TableDecoder, enc_dec, gpt, random_rows

from aiayn.decoding import GenerationConfig, generate, greedy, left_pad, logits_to_probs, right_pad
from aiayn.decoding.processors import (
    apply_repetition_penalty,
    block_repeated_ngrams,
    suppress_tokens,
    top_k_filter,
    top_p_filter,
)
from aiayn.tokenization.special import EOS_ID as EOS

INF = float("inf")


def inputs(family, lengths=(6, 3, 5), seed=0):
    if family == "encoder-decoder":
        return enc_dec("rotary"), *right_pad(random_rows(lengths, seed))
    return gpt("rotary"), *left_pad(random_rows(lengths, seed))


# --- greedy --------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", ["encoder-decoder", "decoder-only"])
def test_each_row_stops_at_its_own_eos(family):
    """Sample freely, then make a token that rows reach at different steps the EOS and sample again
    with the same seed: each row must end right after its first occurrence (pad after), while the
    others run on with unchanged draws."""
    model, ids, mask = inputs(family)
    config = GenerationConfig(max_new_tokens=12, temperature=2.0, eos_id=None)
    free = generate(model, ids, mask, config, generator=torch.Generator().manual_seed(0)).sequences()
    stop = free[0][3]
    out = generate(model, ids, mask, replace(config, eos_id=stop), generator=torch.Generator().manual_seed(0))
    ends = []
    for row, got, reason in zip(free, out.sequences(), out.stop_reasons):
        expected = row[: row.index(stop) + 1] if stop in row else row
        assert got == expected
        assert reason == ("eos" if stop in row else "max_new_tokens")
        ends.append(len(got))
    assert len(set(ends)) > 1, f"rows should end at different steps, got lengths {ends}"
    assert (out.tokens[0, ends[0]:] == 0).all()  # pad after the end


@pytest.mark.parametrize("family", ["encoder-decoder", "decoder-only"])
def test_batch_greedy_equals_one_by_one(family):
    model, ids, mask = inputs(family, seed=3)
    batched = greedy(model, ids, mask, max_new_tokens=6).sequences()
    rows = random_rows((6, 3, 5), 3)
    assert batched == [greedy(model, torch.tensor([r]), max_new_tokens=6).sequences()[0] for r in rows]


def test_decoder_only_needs_max_new_tokens():
    model, ids, mask = inputs("decoder-only")
    with pytest.raises(ValueError, match="max_new_tokens is required"):
        greedy(model, ids, mask)


def test_min_new_tokens_suppresses_eos():
    """The table's greedy path is A EOS; with min 3 new tokens EOS may only come third."""
    table = {(): {A: 0.6, B: 0.4}, (A,): {EOS: 0.6, A: 0.4}, (A, A): {EOS: 0.5, B: 0.5}, (A, A, B): {EOS: 1.0}}
    src = torch.tensor([[7]])
    assert greedy(TableDecoder(table), src, max_new_tokens=5).sequences() == [[A, EOS]]
    assert greedy(TableDecoder(table), src, max_new_tokens=5, min_new_tokens=2).sequences() == [[A, A, EOS]]
    assert greedy(TableDecoder(table), src, max_new_tokens=5, min_new_tokens=3).sequences() == [[A, A, B, EOS]]


# --- sampling ------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", ["encoder-decoder", "decoder-only"])
def test_sampling_with_a_seed_is_reproducible(family):
    model, ids, mask = inputs(family)
    config = GenerationConfig(max_new_tokens=8, temperature=1.5, top_p=0.95)
    first = generate(model, ids, mask, config, generator=torch.Generator().manual_seed(7)).tokens
    again = generate(model, ids, mask, config, generator=torch.Generator().manual_seed(7)).tokens
    other = generate(model, ids, mask, config, generator=torch.Generator().manual_seed(8)).tokens
    assert torch.equal(first, again)
    assert not torch.equal(first, other)


@pytest.mark.parametrize("family", ["encoder-decoder", "decoder-only"])
def test_top_k_1_equals_greedy(family):
    model, ids, mask = inputs(family)
    sampled = generate(model, ids, mask, GenerationConfig(max_new_tokens=8, top_k=1, temperature=3.0),
                       generator=torch.Generator().manual_seed(0))
    assert sampled.sequences() == greedy(model, ids, mask, max_new_tokens=8).sequences()


def test_no_repeat_ngram_blocks_a_repeat_in_generation():
    """An untrained model greedily repeats one token; with no_repeat_ngram_size=2 no bigram repeats."""
    model, ids, mask = inputs("decoder-only")
    free = greedy(model, ids, mask, max_new_tokens=10, eos_id=None)
    assert any(row[0] == row[1] == row[2] for row in free.sequences())  # the model does repeat
    config = GenerationConfig(max_new_tokens=10, greedy=True, no_repeat_ngram_size=2, eos_id=None)
    out = generate(model, ids, mask, config)
    for prompt, row in zip(random_rows((6, 3, 5)), out.sequences()):
        seq = prompt + row
        bigrams = list(zip(seq, seq[1:]))
        assert len(bigrams) == len(set(bigrams))


def test_stop_strings_end_a_row_after_the_text_appears():
    chars = {A: "a", B: "b"}
    detokenize = lambda ids: "".join(chars.get(i, "") for i in ids)  # noqa: E731
    table = {(): {A: 1.0}, (A,): {B: 1.0}, (A, B): {A: 1.0}, (A, B, A): {A: 1.0}, (A, B, A, A): {EOS: 1.0}}
    src = torch.tensor([[7]])
    config = GenerationConfig(max_new_tokens=10, greedy=True, stop_strings=("ba",))
    out = generate(TableDecoder(table), src, None, config, detokenize=detokenize)
    assert out.sequences() == [[A, B, A]] and out.stop_reasons == ["stop_string"]
    with pytest.raises(ValueError, match="stop_strings needs detokenize"):
        generate(TableDecoder(table), src, None, config)


def test_generation_config_errors_name_field_and_value():
    for kwargs, match in [
        ({"temperature": 0.0}, r"temperature=0.0 must be a finite number in \(0, 100\]"),
        ({"top_k": 0}, "top_k=0"),
        ({"top_p": 1.5}, r"top_p=1.5 must be a finite number in \(0, 1\]"),
        ({"max_new_tokens": 0}, "max_new_tokens=0"),
        ({"min_new_tokens": 5, "max_new_tokens": 3}, "min_new_tokens=5 must be <= max_new_tokens=3"),
        ({"stop_strings": ("",)}, "stop_strings"),
        ({"repetition_penalty": 0.0}, "repetition_penalty=0.0"),
    ]:
        with pytest.raises(ValueError, match=match):
            GenerationConfig(**kwargs)


# --- processors ----------------------------------------------------------------------------------


def test_repetition_penalty_math():
    """CTRL: a seen token's positive logit is divided by the penalty, a negative one multiplied."""
    logits = torch.tensor([[2.0, -1.0, 3.0, -2.0, 0.5]])
    history = torch.tensor([[0, 1, 0, 4]])  # tokens 0, 1, 4 seen; the masked 4 does not count
    mask = torch.tensor([[True, True, True, False]])
    out = apply_repetition_penalty(logits, history, mask, 2.0)
    assert out.tolist() == [[1.0, -2.0, 3.0, -2.0, 0.5]]


def test_top_p_keeps_the_smallest_set_reaching_p():
    probs = torch.tensor([[0.1, 0.5, 0.05, 0.3, 0.05]])
    logits = probs.log()
    kept = lambda p: torch.isfinite(top_p_filter(logits, p))[0].nonzero().flatten().tolist()  # noqa: E731
    assert kept(0.4) == [1]  # 0.5 alone reaches 0.4
    assert kept(0.75) == [1, 3]  # 0.5 + 0.3 = 0.8 >= 0.75
    assert kept(0.85) == [0, 1, 3]  # + 0.1 = 0.9
    assert kept(1.0) == [0, 1, 2, 3, 4]
    renormalised = logits_to_probs(logits, top_p=0.75)
    torch.testing.assert_close(renormalised, torch.tensor([[0.0, 0.625, 0.0, 0.375, 0.0]]))


def test_top_k_and_temperature():
    logits = torch.tensor([[1.0, 4.0, 2.0, 3.0]])
    assert torch.isfinite(top_k_filter(logits, 2)).tolist() == [[False, True, False, True]]
    torch.testing.assert_close(logits_to_probs(logits, temperature=0.5), (logits / 0.5).softmax(-1))


def test_block_repeated_ngrams_bans_exactly_the_completing_tokens():
    history = torch.tensor([[5, 6, 7, 5, 6, 8, 5], [0, 0, 5, 6, 7, 5, 6]])
    mask = torch.tensor([[True] * 7, [False, False] + [True] * 5])
    logits = torch.zeros(2, 10)
    banned = ~torch.isfinite(block_repeated_ngrams(logits, history, mask, 2))
    assert banned[0].nonzero().flatten().tolist() == [6]  # "5 6" was seen; the tail is 5
    assert banned[1].nonzero().flatten().tolist() == [7]  # "6 7" was seen; the tail is 6
    banned3 = ~torch.isfinite(block_repeated_ngrams(logits, history, mask, 3))
    assert banned3[0].nonzero().flatten().tolist() == []  # "6 5 ?" never seen before
    assert banned3[1].nonzero().flatten().tolist() == [7]  # "5 6 7" seen; the tail is 5 6


def test_suppress_tokens_only_in_chosen_rows():
    out = suppress_tokens(torch.zeros(2, 4), [2], rows=torch.tensor([True, False]))
    assert out[0, 2] == -INF and out[1, 2] == 0.0 and math.isfinite(out[0, 1])


def test_argmax_last_is_argmax_first_index_on_ties_and_nan_as_largest():
    """Greedy's pick (through ``max``, the faster kernel) is ``argmax``'s, whatever the dtype, ties, NaN or -inf."""
    from aiayn.decoding.sampling import argmax_last

    torch.manual_seed(0)
    rows = torch.randn(6, 50257)
    rows[1, [9, 40000]] = 100.0  # a tie: the first
    rows[2, 123] = float("nan")  # NaN wins, as in argmax
    rows[3] = float("-inf")  # all removed: index 0
    rows[4, ::2] = rows[4].max()  # many ties
    for dtype in (torch.float32, torch.bfloat16, torch.float64):
        scores = rows.to(dtype)
        assert torch.equal(argmax_last(scores), scores.argmax(dim=-1))


def test_native_argmax_is_argmax_in_the_vectors_and_the_tail(native_gemv):
    """Our two-pass kernel, which greedy takes once the library is loaded: argmax's index whether the winner, a tie or a
    NaN falls in the vector part of a row or in the tail after it, in fp32 and bf16, rows of 1 to 40 scores."""
    from aiayn.decoding.sampling import argmax_last

    assert native_gemv.loaded()
    torch.manual_seed(0)
    for n in (1, 7, 8, 15, 16, 17, 33, 40):
        rows = torch.randn(6, n)
        rows[1, -1] = 50.0  # in the tail
        rows[2, [0, n - 1]] = 50.0  # a tie across the two parts
        rows[3, n // 2] = float("nan")
        rows[4] = float("-inf")
        rows[5, n - 1] = float("nan")
        for dtype in (torch.float32, torch.bfloat16):
            scores = rows.to(dtype)
            assert torch.equal(native_gemv.argmax_last(scores), scores.argmax(dim=-1)), (n, dtype)
            assert torch.equal(argmax_last(scores[:, :]), scores.argmax(dim=-1))
    wide = torch.randn(3, 50257)
    wide[0, [40000, 50256]] = 9.0
    assert torch.equal(native_gemv.argmax_last(wide), wide.argmax(dim=-1))
    assert torch.equal(native_gemv.argmax_last(wide[:, ::2]), wide[:, ::2].argmax(dim=-1))  # not contiguous
    with pytest.raises(RuntimeError, match="scores \\(B, V\\) float32 or bfloat16"):
        native_gemv.argmax_last(torch.zeros(2, 3, dtype=torch.float64))
