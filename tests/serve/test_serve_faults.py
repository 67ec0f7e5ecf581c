"""Faults while a batch runs (issue 16 item 10): a client disconnects mid-stream while others stream, a
bad request arrives, the model raises inside a step. The others' outputs are exactly what they get alone."""

from __future__ import annotations

import concurrent.futures

import httpx
import pytest
from serve_helpers import fail_at_position, reference_completion, slow_down, sse_events
from servers import served_model

PROMPTS = ["a cat", "the dog", "hello world."]


def stream_text(url: str, prompt: str, max_tokens: int, seed: int) -> tuple[str, str]:
    with httpx.stream("POST", url + "/v1/completions", json={"prompt": prompt, "max_tokens": max_tokens, "seed": seed, "stream": True}, timeout=60) as r:
        assert r.status_code == 200, r.read()
        events = sse_events(r.iter_lines())
    assert events[-1] == "[DONE]"
    chunks = [e["choices"][0] for e in events[:-1]]
    return "".join(c["text"] for c in chunks), chunks[-1]["finish_reason"]


@pytest.fixture()
def slow_lm(tokenizer):
    served = served_model(tokenizer, "tiny-decoder-only", max_len=64)
    reference = {p: reference_completion(served, p, 30, i) for i, p in enumerate(PROMPTS)}
    slow_down(served, 0.01)
    return served, reference


def test_a_client_disconnects_while_others_stream(serve, slow_lm):
    served, reference = slow_lm
    server = serve(served)
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        others = [pool.submit(stream_text, server.url, p, 30, i) for i, p in enumerate(PROMPTS)]
        with httpx.stream("POST", server.url + "/v1/completions", json={"prompt": "a", "max_tokens": 50, "stream": True}, timeout=30) as r:
            lines = r.iter_lines()
            assert next(lines).startswith("data: ")  # then hang up
        assert [f.result(60) for f in others] == [reference[p] for p in PROMPTS]


def test_a_bad_request_during_a_running_batch(serve, slow_lm):
    served, reference = slow_lm
    server = serve(served)
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        others = [pool.submit(stream_text, server.url, p, 30, i) for i, p in enumerate(PROMPTS)]
        bad = httpx.post(server.url + "/v1/completions", json={"prompt": "a", "max_tokens": 2, "top_p": -1}, timeout=30)
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "top_p"
        assert [f.result(60) for f in others] == [reference[p] for p in PROMPTS]


def test_the_model_raises_inside_a_step(serve, tokenizer):
    """The step that feeds position 30 raises: only the long prompt's request reaches it. It gets a 500
    with the error; the rows sharing its batch finish as they would alone; the next request works."""
    served = served_model(tokenizer, "tiny-decoder-only", max_len=64)
    reference = {p: reference_completion(served, p, 12, i) for i, p in enumerate(PROMPTS)}
    slow_down(served, 0.005)
    fail_at_position(served, 30)
    server = serve(served)
    long_prompt = "a cat sat on the mat, the dog"  # 29 tokens: its decode steps feed positions 29, 30, ...; the others stay below 24
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        others = [pool.submit(stream_text, server.url, p, 12, i) for i, p in enumerate(PROMPTS)]
        failing = pool.submit(httpx.post, server.url + "/v1/completions", json={"prompt": long_prompt, "max_tokens": 10, "seed": 0}, timeout=60)
        response = failing.result(60)
        assert [f.result(60) for f in others] == [reference[p] for p in PROMPTS]
    assert response.status_code == 500
    error = response.json()["error"]
    assert error["type"] == "server_error" and "injected fault at position 30" in error["message"]
    ok = httpx.post(server.url + "/v1/completions", json={"prompt": "the dog", "max_tokens": 12, "seed": 1}, timeout=30)
    assert ok.status_code == 200 and ok.json()["choices"][0]["text"] == reference["the dog"][0]
