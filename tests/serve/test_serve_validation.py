"""Each refusal is its own test, and after each the next good request succeeds: malformed JSON (400),
a body over the limit (413), a full queue (429), a request while the model loads (503), a client that
disconnects mid-stream (its slot is free at once)."""

from __future__ import annotations

import threading
import time

import httpx
import pytest
from serve_helpers import reference_completion, slow_down, sse_events
from servers import served_model

GOOD = {"prompt": "a cat", "max_tokens": 3, "seed": 0}


def good_request_succeeds(server) -> None:
    r = httpx.post(server.url + "/v1/completions", json=GOOD, timeout=30)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["finish_reason"] in ("stop", "length")


@pytest.fixture()
def lm_server(serve, lm_model):
    return serve(lm_model)


@pytest.mark.parametrize("content", [b"{bad json", b'{"prompt": "a",}', b""])
def test_malformed_json_gets_400(lm_server, content):
    r = httpx.post(lm_server.url + "/v1/completions", content=content, headers={"content-type": "application/json"})
    assert r.status_code == 400
    assert r.json()["error"]["type"] == "invalid_request_error"
    good_request_succeeds(lm_server)


def test_wrong_types_get_400(lm_server):
    for body, param in (({"prompt": 5, "max_tokens": 3}, "prompt"), ({"prompt": "a", "max_tokens": "3"}, "max_tokens"),
                        ({"prompt": "a", "stream": 1}, "stream"), ({"max_tokens": 3}, "prompt")):
        r = httpx.post(lm_server.url + "/v1/completions", json=body)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    good_request_succeeds(lm_server)


def test_body_over_the_limit_gets_413(serve, lm_model):
    server = serve(lm_model, max_body_bytes=2000)
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "a" * 5000, "max_tokens": 1})
    assert r.status_code == 413 and "2000 bytes" in r.json()["error"]["message"]

    def chunks():  # no Content-Length: the limit is counted as the body arrives
        for _ in range(10):
            yield b" " * 500

    r = httpx.post(server.url + "/v1/completions", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413
    good_request_succeeds(server)


def test_full_queue_gets_429(serve, tokenizer):
    served = served_model(tokenizer, "tiny-decoder-only", max_len=64)
    assert reference_completion(served, "a", 60, 0, temperature=0)[1] == "length"  # greedy: the running request cannot end early
    slow_down(served, 0.02)
    server = serve(served, max_batch=1, max_queue=1)
    results = {}

    def stream(name, max_tokens):
        body = {"prompt": "a", "max_tokens": max_tokens, "stream": True, "temperature": 0}
        with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as r:
            results[name] = (r.status_code, sse_events(r.iter_lines()))

    running = threading.Thread(target=stream, args=("running", 60))
    running.start()
    _wait_for(lambda: _metric(server, "aiayn_running") == 1)
    waiting = threading.Thread(target=stream, args=("waiting", 2))
    waiting.start()
    _wait_for(lambda: _metric(server, "aiayn_queue_depth") == 1)
    r = httpx.post(server.url + "/v1/completions", json=GOOD)
    assert r.status_code == 429 and r.json()["error"]["code"] == "queue_full" and "--max-queue=1" in r.json()["error"]["message"]
    running.join(60)
    waiting.join(60)
    assert results["running"][0] == 200 and results["waiting"][0] == 200
    good_request_succeeds(server)


def test_request_while_loading_gets_503(serve, lm_model):
    release = threading.Event()

    def load():
        release.wait(30)
        return lm_model

    server = serve(load, wait_ready=False)
    for path in ("/health", "/v1/models"):
        r = httpx.get(server.url + path)
        assert r.status_code == 503 and r.json()["error"]["code"] == "model_loading", r.text
    r = httpx.post(server.url + "/v1/completions", json=GOOD)
    assert r.status_code == 503 and "loading" in r.json()["error"]["message"]
    release.set()
    _wait_for(lambda: httpx.get(server.url + "/health").status_code == 200)
    good_request_succeeds(server)


def test_failed_load_is_reported(serve):
    def load():
        raise FileNotFoundError("no model at /nowhere")

    server = serve(load, wait_ready=False)
    _wait_for(lambda: httpx.get(server.url + "/health").json()["error"]["code"] == "model_load_failed")
    assert "/nowhere" in httpx.post(server.url + "/v1/completions", json=GOOD).json()["error"]["message"]


def test_disconnect_mid_stream_frees_the_slot_at_once(serve, tokenizer):
    served = served_model(tokenizer, "tiny-decoder-only", max_len=64)
    slow_down(served, 0.05)  # the abandoned request alone would hold the only slot for 60 x 50 ms = 3 s
    server = serve(served, max_batch=1)
    with httpx.stream("POST", server.url + "/v1/completions", json={"prompt": "a", "max_tokens": 60, "stream": True, "temperature": 0}, timeout=30) as r:
        lines = r.iter_lines()
        assert next(lines).startswith("data: ")
    start = time.perf_counter()
    good_request_succeeds(server)
    assert time.perf_counter() - start < 1.5
    _wait_for(lambda: _metric(server, "aiayn_running") == 0)


def _metric(server, name: str) -> float:
    for line in httpx.get(server.url + "/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"no metric {name}")


def _wait_for(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.02)
    raise AssertionError("condition not met in time")
