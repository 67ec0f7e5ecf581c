"""Continuous batching's state surgery: rows prefilled alone, joined (left-padded, caches included),
stepped together, split and trimmed give the logits each row gets decoded alone."""

from __future__ import annotations

import pytest
import torch

from aiayn import build_model
from aiayn.decoding.adapters import CausalLMDecoder
from aiayn.serve import batch_state


@pytest.mark.parametrize(("positions", "kv_dtype"), [("learned", None), ("rotary", None), ("alibi", None), ("sinusoidal", None),
                                                     ("learned", torch.bfloat16)])
def test_joined_rows_decode_as_they_do_alone(positions, kv_dtype):
    """(kv_dtype: the caches kept in bf16, joined and trimmed in bf16.)"""
    torch.manual_seed(0)
    model = build_model("tiny-decoder-only", vocab_size=40, positions=positions, max_len=64).eval()
    decoder = CausalLMDecoder(model, kv_dtype=kv_dtype)
    prompts = [[5, 6, 7, 8, 9, 10, 11], [12, 13], [14, 15, 16, 17]]
    feeds = torch.randint(7, 40, (3, 6))  # tokens each row is fed, step by step

    alone = []
    for b, prompt in enumerate(prompts):
        state, logits = decoder.start(torch.tensor([prompt]), max_new_tokens=10)
        rows = [logits[0]]
        for t in range(feeds.shape[1]):
            rows.append(decoder.step(feeds[b, t : t + 1], state)[0])
        alone.append(torch.stack(rows))

    # Row 0 starts; row 1 joins after 2 steps; row 2 after 3; row 1 leaves after 4 steps (then trim).
    got: list[list[torch.Tensor]] = [[], [], []]
    state, logits = decoder.start(torch.tensor([prompts[0]]), max_new_tokens=10)
    got[0].append(logits[0])
    active, fed = [0], [0, 0, 0]
    for step in range(9):
        if step == 2 or step == 3:
            joiner = 1 if step == 2 else 2
            s2, l2 = decoder.start(torch.tensor([prompts[joiner]]), max_new_tokens=10)
            state = batch_state.join(state, s2, pad_id=0)
            got[joiner].append(l2[0])
            active.append(joiner)
        if step == 5:
            keep = [i for i, b in enumerate(active) if b != 0]
            state.select(torch.tensor(keep))
            width = state.tokens.shape[1]
            batch_state.trim(state)
            assert state.tokens.shape[1] < width and int(state.pads.min()) == 0
            active = [active[i] for i in keep]
        live = [b for b in active if fed[b] < feeds.shape[1]]
        if live != active:
            break
        tokens = torch.stack([feeds[b, fed[b]] for b in active])
        logits = decoder.step(tokens, state)
        for i, b in enumerate(active):
            got[b].append(logits[i])
            fed[b] += 1
    assert {layer.k.dtype for layer in state.cache.self_attn} == {kv_dtype or torch.float32}
    for b in range(3):
        n = len(got[b])
        assert n >= 3
        torch.testing.assert_close(torch.stack(got[b]), alone[b][:n], atol=2e-5, rtol=1e-4)


def test_subset_and_restore_leave_the_batch_as_it_was():
    torch.manual_seed(0)
    model = build_model("tiny-decoder-only", vocab_size=40, max_len=64).eval()
    decoder = CausalLMDecoder(model)
    a, _ = decoder.start(torch.tensor([[5, 6, 7]]), max_new_tokens=4)
    b, _ = decoder.start(torch.tensor([[8, 9]]), max_new_tokens=4)
    state = batch_state.join(a, b, pad_id=0)
    saved = batch_state.snapshot(state)
    before = decoder.step(torch.tensor([10, 11]), state)
    batch_state.restore(state, saved)
    alone = decoder.step(torch.tensor([11]), batch_state.subset(state, torch.tensor([1])))
    again = decoder.step(torch.tensor([10, 11]), state)
    torch.testing.assert_close(again, before)
    torch.testing.assert_close(alone[0], before[1], atol=2e-5, rtol=1e-4)


def test_only_growing_full_attention_caches_are_joinable():
    model = build_model("tiny-decoder-only", vocab_size=40, max_len=64).eval()
    assert batch_state.joinable(model.new_cache())
    assert not batch_state.joinable(model.new_cache(max_len=16))  # a static cache
