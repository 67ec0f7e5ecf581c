"""What evaluation clients ask of ``/v1/completions``, through the official ``openai`` client: ``logprobs``
and ``echo`` (plain and streamed) equal to the model's own log-probabilities (``aiayn.load(...).score``),
for our model and a tiny Hugging Face GPT-2 import with its real tokenizer; ``n`` and ``best_of``; past
the learned context, as the CLI (a window slides, and the response says so)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from serve_helpers import reference_completion

from aiayn.api import LoadedModel
from aiayn.serve.loading import load_served_model

openai = pytest.importorskip("openai")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "conformance"))
from variants import variant_dir  # noqa: E402  (the tiny GPT-2 directory with its real tokenizer)


def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=30)


def python(served) -> LoadedModel:
    return LoadedModel(served.model, served.src_tokenizer, served.tgt_tokenizer, path=served.name, labels=served.labels)


@pytest.fixture(scope="module")
def gpt2():
    return load_served_model(variant_dir("hf-gpt2"), name="tiny")


@pytest.fixture(params=["ours", "gpt2"])
def model(request, lm_model, gpt2):
    return lm_model if request.param == "ours" else gpt2


def test_logprobs_are_the_models_own(serve, model):
    """Greedy tokens with their log-probabilities and top 2, equal to the model's log-softmax on the whole sequence."""
    c, prompt = client(serve(model)), "the cat"
    tok = model.src_tokenizer
    out = c.completions.create(model="tiny", prompt=prompt, max_tokens=6, temperature=0, logprobs=2,
                               extra_body={"return_tokens_as_token_ids": True})  # exact where a token is part of a character
    choice = out.choices[0]
    lp = choice.logprobs
    ids = [int(t.removeprefix("token_id:")) for t in lp.tokens]
    assert tok.decode(ids) == choice.text and len(ids) == len(lp.token_logprobs) == len(lp.top_logprobs) == 6
    assert lp.text_offset == [len(tok.decode(ids[:i])) for i in range(len(ids))]
    for token, chosen, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert len(top) == 2 and top[token] == chosen == max(top.values())  # greedy: the chosen one is the most likely
    sequence = torch.tensor([tok.encode(prompt) + ids])
    with torch.no_grad():
        log_probs = model.model(sequence, torch.ones_like(sequence, dtype=torch.bool)).float().log_softmax(-1)[0]
    expected = [float(log_probs[len(tok.encode(prompt)) - 1 + i, t]) for i, t in enumerate(ids)]
    assert lp.token_logprobs == pytest.approx(expected, abs=1e-5)


def test_echo_as_lm_eval_sends_it(serve, model):
    """lm-eval's loglikelihood request: token-id prompts, echo, logprobs 1, max_tokens 1, temperature 0."""
    tok = model.src_tokenizer
    bos = python(model).special_ids.bos  # from BOS, the prompt's log-probability is Python's score
    prompts = [[bos, *tok.encode("the cat sat")], [bos, *tok.encode("a dog")]]
    c = client(serve(model))
    out = c.completions.create(model="tiny", prompt=prompts, max_tokens=1, temperature=0, logprobs=1, echo=True, seed=1234)
    loaded = python(model)
    for choice, ids in zip(out.choices, prompts):
        lp = choice.logprobs
        assert len(lp.tokens) == len(ids) + 1 and lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
        assert choice.text.startswith(tok.decode(ids)) and "".join(lp.tokens) == choice.text
        assert sum(lp.token_logprobs[1:-1]) == pytest.approx(loaded.score([tok.decode(ids)])[0], abs=1e-4)
    scored = c.completions.create(model="tiny", prompt=prompts[0], max_tokens=0, echo=True, logprobs=0)
    assert scored.choices[0].logprobs.token_logprobs == out.choices[0].logprobs.token_logprobs[:-1]
    assert scored.usage.completion_tokens == 0


def test_streamed_logprobs_and_echo_equal_the_whole(serve, model):
    c = client(serve(model))
    kwargs = {"model": "tiny", "prompt": "the dog", "max_tokens": 8, "seed": 5, "logprobs": 1, "echo": True}
    whole = c.completions.create(**kwargs).choices[0]
    chunks = [chunk.choices[0] for chunk in c.completions.create(**kwargs, stream=True) if chunk.choices]
    assert "".join(ch.text for ch in chunks) == whole.text
    streamed = [ch.logprobs for ch in chunks if ch.logprobs is not None]
    assert sum((s.tokens for s in streamed), []) == whole.logprobs.tokens
    assert sum((s.token_logprobs for s in streamed), []) == pytest.approx(whole.logprobs.token_logprobs)
    assert sum((s.text_offset for s in streamed), []) == whole.logprobs.text_offset


def test_n_samples_differ_and_repeat(serve, lm_model):
    c = client(serve(lm_model))
    three = [ch.text for ch in c.completions.create(model="tiny", prompt="a cat", max_tokens=12, n=3, seed=9).choices]
    assert len(set(three)) == 3
    assert [ch.text for ch in c.completions.create(model="tiny", prompt="a cat", max_tokens=12, n=3, seed=9).choices] == three
    assert three[0] == reference_completion(lm_model, "a cat", 12, 9)[0]  # sample j is seeded with seed + j
    two_prompts = c.completions.create(model="tiny", prompt=["a cat", "h"], max_tokens=5, n=2, seed=9).choices
    assert [ch.index for ch in two_prompts] == [0, 1, 2, 3]
    assert [ch.text for ch in two_prompts] == [reference_completion(lm_model, p, 5, 9 + j)[0] for p in ("a cat", "h") for j in (0, 1)]


def test_best_of_returns_the_most_likely_sample(serve, lm_model):
    c = client(serve(lm_model))
    samples = c.completions.create(model="tiny", prompt="a cat", max_tokens=10, n=4, seed=3, logprobs=0).choices
    mean = [sum(s.logprobs.token_logprobs) / len(s.logprobs.token_logprobs) for s in samples]
    best = c.completions.create(model="tiny", prompt="a cat", max_tokens=10, n=1, best_of=4, seed=3).choices
    assert [b.text for b in best] == [samples[mean.index(max(mean))].text]
    with pytest.raises(openai.BadRequestError, match="best_of"):
        c.completions.create(model="tiny", prompt="a", max_tokens=2, n=1, best_of=2, stream=True)


def test_past_the_context_a_window_slides_as_in_the_cli(serve, lm_model):
    """max_len 64, learned positions: 70 new tokens as ``aiayn generate`` makes them, and the response says so."""
    c = client(serve(lm_model))
    out = c.completions.create(model="tiny", prompt="a cat", max_tokens=70, temperature=0)
    assert out.choices[0].text == python(lm_model).generate("a cat", max_new_tokens=70, greedy=True)[len("a cat"):]
    assert out.choices[0].model_extra["window_slid"] is True and out.usage.completion_tokens == 70
    short = c.completions.create(model="tiny", prompt="a cat", max_tokens=5, seed=0)
    assert short.choices[0].model_extra["window_slid"] is False
    sampled = c.completions.create(model="tiny", prompt="a cat", max_tokens=66, seed=4, extra_body={"top_k": 5})  # as in the CLI
    assert sampled.choices[0].text == reference_completion(lm_model, "a cat", 66, 4, top_k=5)[0]
