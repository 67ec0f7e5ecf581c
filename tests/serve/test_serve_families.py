"""The encoder-decoder and encoder-only endpoints over httpx: results equal ``aiayn.load(...)``'s methods
(:class:`~aiayn.api.LoadedModel`, which read every special id from the tokenizer), batched requests equal
lone ones, and each family refuses the others' endpoints. The tokenizers here give their special
tokens ids other than the library's fixed ones, so a server that used the fixed ids would differ."""

from __future__ import annotations

import concurrent.futures
import dataclasses

import httpx
import pytest
from serve_helpers import sse_events
from servers import TEXTS, served_model

from aiayn.api import LoadedModel
from aiayn.serve.loading import ServedModel
from aiayn.tokenization import CharTokenizer
from aiayn.tokenization.special import DEFAULT_SPECIAL_IDS, SpecialIds

SOURCES = ["a cat sat", "the dog ran", "hello world.", "mat"]


class ShuffledSpecials(CharTokenizer):
    """A character tokenizer whose special tokens play other roles than the library's fixed ids say
    (``<sep>`` begins, ``<cls>`` ends, ``<bos>`` is the mask...): the ids must come from the tokenizer."""

    special_ids: SpecialIds = SpecialIds(pad=0, bos=5, eos=4, unk=3, cls=2, sep=6, mask=1)


class NoMask(CharTokenizer):
    special_ids: SpecialIds = dataclasses.replace(DEFAULT_SPECIAL_IDS, mask=None)


def shuffled(tokenizer_class=ShuffledSpecials) -> CharTokenizer:
    return tokenizer_class.train(TEXTS)


@pytest.fixture(scope="module")
def translator():
    return served_model(shuffled(), "tiny-encoder-decoder", name="tiny-mt", max_len=64)


@pytest.fixture(scope="module")
def bert():
    served = served_model(shuffled(), "tiny-encoder-only", name="tiny-bert", n_classes=3)
    served.labels = ["red", "green", "blue"]
    return served


def python(served: ServedModel) -> LoadedModel:
    """The model as ``aiayn.load`` would give it."""
    return LoadedModel(served.model, served.src_tokenizer, served.tgt_tokenizer, path=served.name, labels=served.labels)  # type: ignore[arg-type]


def reference_translation(served, text: str, beam_size: int, max_tokens: int) -> str:
    return python(served).translate(text, beam_size=beam_size, max_new_tokens=max_tokens)[0]


def test_translations_equal_beam_search_alone(serve, translator):
    server = serve(translator)
    r = httpx.post(server.url + "/v1/translations", json={"text": SOURCES, "beam_size": 3, "max_tokens": 12}, timeout=30)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "translation" and body["usage"]["prompt_tokens"] == sum(len(s) + 1 for s in SOURCES)
    assert any(c["text"] for c in body["choices"])
    assert [c["text"] for c in body["choices"]] == [reference_translation(translator, s, 3, 12) for s in SOURCES]


def test_concurrent_translations_are_searched_together_and_equal_alone(serve, translator):
    server = serve(translator)

    def one(text):
        return httpx.post(server.url + "/v1/translations", json={"text": text, "beam_size": 2, "max_tokens": 10}, timeout=30).json()["choices"][0]["text"]

    with concurrent.futures.ThreadPoolExecutor(len(SOURCES)) as pool:
        together = list(pool.map(one, SOURCES))
    assert together == [reference_translation(translator, s, 2, 10) for s in SOURCES]


def test_streamed_greedy_translation(serve, translator):
    server = serve(translator)
    with httpx.stream("POST", server.url + "/v1/translations", json={"text": "a cat sat", "beam_size": 1, "max_tokens": 12, "stream": True}, timeout=30) as r:
        events = sse_events(r.iter_lines())
    assert events[-1] == "[DONE]" and events[-2]["usage"]["completion_tokens"] >= 1
    text = "".join(e["choices"][0]["text"] for e in events[:-2])
    assert text == reference_translation(translator, "a cat sat", 1, 12)


def test_translation_errors(serve, translator):
    server = serve(translator)
    for body, param in (({"text": ""}, "text"), ({"text": "a", "beam_size": 0}, "beam_size"), ({"text": "a", "max_tokens": 999}, "max_tokens"),
                        ({"text": ["a", ""]}, "text[1]"), ({"text": "a", "temperature": 1}, "temperature")):
        r = httpx.post(server.url + "/v1/translations", json=body)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "a"})
    assert r.status_code == 404 and "encoder-decoder" in r.json()["error"]["message"]


def test_attention_page_for_a_translation(serve, translator):
    server = serve(translator)
    r = httpx.post(server.url + "/v1/attention", json={"text": "a cat", "target": "the dog"}, timeout=30)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert "encoder-decoder (cross) attention" in r.text and "http://" not in r.text and "https://" not in r.text


def test_classifications_equal_classify(serve, bert):
    server = serve(bert)
    texts = ["a cat sat", "the dog", "hello world."]
    r = httpx.post(server.url + "/v1/classifications", json={"input": texts}, timeout=30)
    assert r.status_code == 200, r.text
    data = r.json()["data"]
    for got, expected in zip(data, python(bert).classify(texts), strict=True):
        assert got["label"] == expected.label and got["prob"] == pytest.approx(expected.prob, abs=1e-6)
        assert got["probs"] == pytest.approx(expected.probs, abs=1e-6) and list(got["probs"]) == ["red", "green", "blue"]


def test_fill_mask(serve, bert):
    server = serve(bert)
    mask = bert.src_tokenizer.id_to_token(bert.src_tokenizer.special_ids.mask)
    texts = [f"a {mask} sat", f"the {mask}og {mask}"]
    r = httpx.post(server.url + "/v1/fill-mask", json={"input": texts, "top_k": 3}, timeout=30)
    assert r.status_code == 200, r.text
    data = r.json()["data"]
    assert [len(d["masks"]) for d in data] == [1, 2]
    for got, text in zip(data, texts):
        expected = python(bert).fill_mask(text, top_k=3).candidates
        assert [[c["token"].strip() for c in m["candidates"]] for m in got["masks"]] == [[t for t, _ in e] for e in expected]
        assert [c["prob"] for m in got["masks"] for c in m["candidates"]] == pytest.approx([p for e in expected for _, p in e], abs=1e-6)
    r = httpx.post(server.url + "/v1/fill-mask", json={"input": "no mask here"})
    assert r.status_code == 400 and mask in r.json()["error"]["message"]


def test_a_tokenizer_without_a_mask_token_refuses_fill_mask(serve):
    server = serve(served_model(shuffled(NoMask), "tiny-encoder-only", name="no-mask", n_classes=2))
    r = httpx.post(server.url + "/v1/fill-mask", json={"input": "a <mask> sat"})
    assert r.status_code == 400 and "no mask token" in r.json()["error"]["message"], r.text
    assert r.json()["error"]["code"] == "unsupported_endpoint"
    card = httpx.get(server.url + "/v1/models").json()["data"][0]
    assert "/v1/fill-mask" not in card["endpoints"] and "/v1/classifications" in card["endpoints"]
    assert "mask" not in card["tokenizer"]["special_tokens"]
    assert httpx.post(server.url + "/v1/classifications", json={"input": "a cat"}).status_code == 200
