"""The server under hostile clients (127.0.0.1 only, bounded, a few seconds): stalled headers and bodies
are cut off by their timeouts, disconnected streams are counted as such, a burst past the queue gets
429, and afterwards the server still answers, its memory is back and its metrics add up."""

from __future__ import annotations

import gc
import re
import socket
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="needs the serve extra (pip install aiayn[serve])")
import httpx
import torch
from reliability_server import start, stop

from aiayn import build_model
from aiayn.cli.main import main
from aiayn.serve.app import create_app
from aiayn.serve.loading import ServedModel
from aiayn.tokenization import CharTokenizer

pytestmark = pytest.mark.reliability
COMPLETIONS = "/v1/completions"


def _rss() -> int:
    return int(re.search(r"VmRSS:\s+(\d+)", Path("/proc/self/status").read_text()).group(1)) * 1024


def _served() -> ServedModel:
    tokenizer = CharTokenizer.train(["a cat sat on the mat", "the dog ran"])
    torch.manual_seed(0)
    model = build_model("tiny-decoder-only", vocab_size=tokenizer.vocab_size, max_len=128).eval()
    forward = model.forward

    def slow(*args, **kwargs):  # a step of a real model: holds the batch long enough to queue and to disconnect
        time.sleep(0.005)
        return forward(*args, **kwargs)

    model.forward = slow  # type: ignore[method-assign]
    return ServedModel(model, model.config, tokenizer, tokenizer, "tiny")


def _start(**limits):
    served = _served()
    return start(create_app(lambda: served, max_batch=2, max_queue=4, body_timeout=limits.pop("body_timeout")), **limits)


def _requests_total(url: str) -> Counter:
    text = httpx.get(url + "/metrics").text
    found = re.findall(r'aiayn_requests_total\{endpoint="([^"]+)",status="([^"]+)"\} ([0-9.e+]+)', text)
    return Counter({(e, s): int(float(v)) for e, s, v in found})


def _closed_by_server(sock: socket.socket, timeout: float = 5.0) -> bytes:
    """Everything the server sends until it closes the connection (within ``timeout``)."""
    sock.settimeout(timeout)
    data = b""
    while chunk := sock.recv(4096):
        data += chunk
    return data


def test_slow_clients_disconnects_and_a_burst_leave_a_server_that_answers_with_metrics_that_add_up(tmp_path):
    server, thread, url = _start(header_timeout=0.5, body_timeout=0.5, max_connections=40)
    host, port = url.removeprefix("http://").split(":")
    try:
        with httpx.Client(base_url=url, timeout=30) as client:  # warm up, then the memory to come back to
            for _ in range(3):
                assert client.post(COMPLETIONS, json={"prompt": "a cat", "max_tokens": 8}).status_code == 200
        gc.collect()
        before, baseline = _rss(), _requests_total(url)

        # Slow clients: 8 that never finish their headers, 8 that stall their body.
        stalled_headers = [socket.create_connection((host, int(port))) for _ in range(8)]
        for sock in stalled_headers:
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
        stalled_bodies = [socket.create_connection((host, int(port))) for _ in range(8)]
        for sock in stalled_bodies:
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 100\r\n\r\n{\"prompt\": ")

        # Disconnects: 6 streams closed after their first event.
        streamed: list[int] = []

        def stream_and_leave() -> None:
            with httpx.Client(base_url=url, timeout=30) as c, c.stream(
                "POST", COMPLETIONS, json={"prompt": "the", "max_tokens": 100, "stream": True}
            ) as response:
                streamed.append(response.status_code)
                if response.status_code == 200:
                    next(response.iter_lines())

        # A burst past the queue: 2 rows run, 4 wait, the rest get 429.
        statuses: list[int] = []

        def complete() -> None:
            with httpx.Client(base_url=url, timeout=30) as c:
                statuses.append(c.post(COMPLETIONS, json={"prompt": "a", "max_tokens": 20}).status_code)

        # Streams in two waves of 3 (well within the batch and queue, whose rows a stream frees once its
        # handler sees the client gone), then the burst.
        for target, count in ((stream_and_leave, 3), (stream_and_leave, 3), (complete, 14)):
            workers = [threading.Thread(target=target) for _ in range(count)]
            for worker in workers:
                worker.start()
            for worker in workers:
                worker.join(timeout=60)
            assert not any(w.is_alive() for w in workers)

        for sock in stalled_headers:  # closed by the header timeout, nothing answered
            assert _closed_by_server(sock) == b""
            sock.close()
        for sock in stalled_bodies:  # 408 naming the flag, then closed
            answer = _closed_by_server(sock)
            assert answer.startswith(b"HTTP/1.1 408") and b"--body-timeout" in answer, answer[:200]
            sock.close()

        counts = Counter(statuses)
        assert set(counts) <= {200, 429} and counts[429] > 0 and len(statuses) == 14, counts
        with httpx.Client(base_url=url, timeout=30) as client:  # still answers
            assert client.get("/health").status_code == 200
            assert client.post(COMPLETIONS, json={"prompt": "a cat", "max_tokens": 4}).status_code == 200
        deadline = time.monotonic() + 10
        while True:  # a disconnected stream is counted once its handler has noticed
            total = _requests_total(url) - baseline
            if sum(v for (e, _), v in total.items() if e == COMPLETIONS) >= 6 + 8 + 14 + 1 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        # A stream the server finished before it saw the client go is a 200 (its bytes were all sent): on a
        # loaded machine one may be. Every request is counted once, under one label.
        left, refused = total[(COMPLETIONS, "disconnected")], streamed.count(429)
        assert set(streamed) <= {200, 429} and left >= 3, (streamed, total)
        assert total[(COMPLETIONS, "200")] == counts[200] + 1 + (6 - refused - left), total
        assert total[(COMPLETIONS, "408")] == 8
        assert total[(COMPLETIONS, "429")] == counts[429] + refused
        assert sum(v for (endpoint, _), v in total.items() if endpoint == COMPLETIONS) == 6 + 8 + 14 + 1
        # The connection cap: with --max-connections open (idle, headers not sent yet), a request gets 503.
        idle = [socket.create_connection((host, int(port))) for _ in range(40)]
        try:
            time.sleep(0.1)
            assert httpx.post(url + COMPLETIONS, json={"prompt": "a", "max_tokens": 1}, timeout=30).status_code == 503
        finally:
            for sock in idle:
                sock.close()
        gc.collect()
        assert _rss() <= before * 1.10, (before, _rss())
    finally:
        stop(server, thread)


def test_serve_help_shows_the_timeouts_and_the_connection_cap(capsys):
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    for flag in ("--body-timeout", "--header-timeout", "--max-connections"):
        assert flag in shown


def test_device_is_checked_before_listening(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    bound: list[object] = []
    monkeypatch.setattr(socket.socket, "bind", lambda self, address: bound.append(address))
    with pytest.raises(SystemExit) as exit_:
        main(["serve", "--checkpoint", str(tmp_path), "--device", "cuda"])
    assert exit_.value.code == 2
    assert "argument --device: 'cuda': this machine has no usable CUDA device" in capsys.readouterr().err
    assert bound == []  # never listened
