"""The encoder-decoder and encoder-only endpoints over httpx: results equal the library's functions
run in process, batched requests equal lone ones, and each family refuses the others' endpoints."""

from __future__ import annotations

import concurrent.futures

import httpx
import pytest
import torch
from conftest import served_model
from serve_helpers import sse_events

from aiayn.decoding.adapters import Seq2SeqDecoder
from aiayn.decoding.beam import BeamConfig, beam_search
from aiayn.decoding.encoder_only import classify, encode_sentences
from aiayn.tokenization.special import EOS_ID

SOURCES = ["a cat sat", "the dog ran", "hello world.", "mat"]


@pytest.fixture(scope="module")
def translator(tokenizer):
    return served_model(tokenizer, "tiny-encoder-decoder", name="tiny-mt", max_len=64)


@pytest.fixture(scope="module")
def bert(tokenizer):
    return served_model(tokenizer, "tiny-encoder-only", name="tiny-bert", n_classes=3)


def reference_translation(served, text: str, beam_size: int, max_tokens: int) -> str:
    ids = torch.tensor([served.src_tokenizer.encode(text, add_eos=True)])
    tokens = beam_search(Seq2SeqDecoder(served.model), ids, None, BeamConfig(beam_size=beam_size, max_new_tokens=max_tokens))[0][0].tokens
    return served.tgt_tokenizer.decode(tokens[:-1] if tokens and tokens[-1] == EOS_ID else tokens)


def test_translations_equal_beam_search_alone(serve, translator):
    server = serve(translator)
    r = httpx.post(server.url + "/v1/translations", json={"text": SOURCES, "beam_size": 3, "max_tokens": 12}, timeout=30)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "translation" and body["usage"]["prompt_tokens"] == sum(len(s) + 1 for s in SOURCES)
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
    ids, mask = encode_sentences(bert.src_tokenizer, texts)
    expected = classify(bert.model, ids, mask)
    data = r.json()["data"]
    assert [d["label"] for d in data] == expected.labels.tolist()
    assert torch.tensor([d["probs"] for d in data]) == pytest.approx(expected.probs, abs=1e-5)
    assert all(len(d["probs"]) == 3 for d in data)


def test_fill_mask(serve, bert):
    server = serve(bert)
    r = httpx.post(server.url + "/v1/fill-mask", json={"input": ["a <mask> sat", "the <mask>og <mask>"], "top_k": 3}, timeout=30)
    assert r.status_code == 200, r.text
    data = r.json()["data"]
    assert [len(d["masks"]) for d in data] == [1, 2]
    candidates = data[0]["masks"][0]["candidates"]
    assert len(candidates) == 3 and candidates[0]["prob"] >= candidates[1]["prob"] >= candidates[2]["prob"]
    r = httpx.post(server.url + "/v1/fill-mask", json={"input": "no mask here"})
    assert r.status_code == 400 and "<mask>" in r.json()["error"]["message"]
