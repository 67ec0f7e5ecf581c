"""Streaming yields the same tokens as the non-streaming call, as they come."""

import torch
from decoding_helpers import gpt, random_rows

from aiayn.decoding import GenerationConfig, TextStreamer, generate, generate_steps, left_pad, stream_text
from aiayn.tokenization import CharTokenizer

CONFIG = GenerationConfig(max_new_tokens=10, temperature=1.5, top_k=20)


def test_steps_iterator_equals_generate():
    model = gpt()
    ids, mask = left_pad(random_rows([5, 2, 4]))
    per_row = [[], [], []]
    for step in generate_steps(model, ids, mask, CONFIG, generator=torch.Generator().manual_seed(3)):
        for b in step.emitted.nonzero().flatten().tolist():
            per_row[b].append(int(step.tokens[b]))
    assert per_row == generate(model, ids, mask, CONFIG, generator=torch.Generator().manual_seed(3)).sequences()


def test_callback_sees_every_step_before_the_end():
    model = gpt()
    ids, mask = left_pad(random_rows([5, 2]))
    seen = []
    out = generate(model, ids, mask, CONFIG, generator=torch.Generator().manual_seed(3), on_step=lambda s: seen.append(s.tokens))
    assert torch.equal(torch.stack(seen, dim=1), out.tokens)


def test_steps_come_lazily():
    """The iterator is a generator: nothing beyond what was asked for has been decoded."""
    model = gpt()
    steps = generate_steps(model, torch.tensor([[9, 10]]), None, GenerationConfig(max_new_tokens=50, greedy=True))
    first = next(steps)
    assert first.tokens.shape == (1,)
    steps.close()


def test_stream_text_equals_decoded_generation():
    tokenizer = CharTokenizer.train(["abcdefghijklmnopqrstuvwxyz ,."])
    model = gpt(vocab_size=tokenizer.vocab_size)
    ids = torch.tensor([tokenizer.encode("hello")])
    pieces = list(stream_text(model, ids, None, CONFIG, detokenize=tokenizer.decode, generator=torch.Generator().manual_seed(1)))
    whole = generate(model, ids, None, CONFIG, generator=torch.Generator().manual_seed(1)).sequences()[0]
    assert "".join(pieces) == tokenizer.decode(whole)
    assert len(pieces) > 1  # it really streamed


def test_text_streamer_holds_back_an_incomplete_character():
    pieces = {1: "ab", 2: "\ufffd", 3: "é"}  # token 2 alone is half a character, 2 + 3 complete it
    def detokenize(ids):
        text = "".join(pieces[i] for i in ids)
        return text.replace("\ufffdé", "é")
    streamer = TextStreamer(detokenize)
    assert streamer.push([1]) == "ab"
    assert streamer.push([2]) == ""
    assert streamer.push([3]) == "é"
