"""``aiayn serve`` as a user runs it: a process that says where it listens, and that ends cleanly on
SIGTERM, finishing the in-flight stream (or cancelling it after --shutdown-timeout), never hanging."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import torch
from serve_helpers import sse_events

from aiayn import build_model
from aiayn.cli.main import main
from aiayn.pretrained import save_pretrained

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, tokenizer) -> str:
    torch.manual_seed(0)
    model = build_model("tiny-decoder-only", vocab_size=tokenizer.vocab_size, max_len=512).eval()
    return str(save_pretrained(tmp_path_factory.mktemp("serve") / "lm", model, tokenizer))


def start(checkpoint: str, *flags: str) -> tuple[subprocess.Popen, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "aiayn", "serve", "--checkpoint", checkpoint, "--port", "0", *flags],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    line = proc.stdout.readline()
    found = re.search(r"listening on (http://127\.0\.0\.1:\d+)", line)
    assert found, (line, proc.stderr.read() if proc.poll() is not None else "")
    url = found.group(1)
    deadline = time.monotonic() + 60
    while not healthy(url):
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.05)
    return proc, url


def healthy(url: str) -> bool:
    """The socket listens before the line is printed, but a loaded CI machine may still time a request out."""
    try:
        return httpx.get(url + "/health", timeout=30).status_code == 200
    except httpx.TimeoutException:
        return False


def stream_in_background(url: str, max_tokens: int) -> tuple[threading.Thread, dict, threading.Event]:
    result: dict = {}
    started = threading.Event()

    def run():
        try:
            with httpx.stream("POST", url + "/v1/completions", json={"prompt": "a", "max_tokens": max_tokens, "stream": True, "temperature": 0}, timeout=60) as r:
                lines = result["lines"] = []
                for line in r.iter_lines():
                    lines.append(line)
                    started.set()
                result["events"] = sse_events(lines)
        except httpx.HTTPError as e:  # the server closed the stream
            result["error"] = e
        started.set()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, result, started


@pytest.mark.slow
def test_sigterm_finishes_the_running_stream_then_exits(checkpoint):
    proc, url = start(checkpoint, "--shutdown-timeout", "60")
    try:
        thread, result, started = stream_in_background(url, 511)  # greedy: this model never picks EOS from "a"
        assert started.wait(30)
        proc.send_signal(signal.SIGTERM)
        thread.join(60)
        assert proc.wait(timeout=30) == 0
        events = result["events"]
        assert events[-1] == "[DONE]" and events[-2]["choices"][0]["finish_reason"] == "length"
        assert len("".join(e["choices"][0]["text"] for e in events[:-1])) > 0
        assert "stopped" in proc.stdout.read()
        with pytest.raises(httpx.TransportError):
            httpx.get(url + "/health")
    finally:
        proc.kill()


@pytest.mark.slow
def test_sigterm_cancels_a_stream_past_the_shutdown_timeout(checkpoint):
    proc, url = start(checkpoint, "--shutdown-timeout", "0.3")
    try:
        # 20,000 tokens (the window slides past the 512 positions): seconds of decoding on any CPU, so the
        # stream is still running when the 0.3 s run out (511 tokens could finish within them on a fast one)
        thread, result, started = stream_in_background(url, 20_000)
        assert started.wait(30)
        begin = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
        assert time.monotonic() - begin < 10
        thread.join(20)
        assert not thread.is_alive()
        # Cut short, and the client is told: an error event, or the connection closed mid-stream.
        events = result.get("events", [])
        assert any(line.startswith("data: {") for line in result.get("lines", [])), result  # it had started: a cut, not a refusal
        assert "error" in result or "error" in events[-2] or events[-1] != "[DONE]", events[-3:]
        if "error" not in result and "error" in events[-2]:
            assert events[-2]["error"]["code"] == "shutting_down"
    finally:
        proc.kill()


def test_bad_flags_name_the_flag(checkpoint):
    for flags, message in ((["--max-batch", "0"], "--max-batch must be >= 1, got 0"), (["--port", "70000"], r"--port must be in \[0, 65535\], got 70000")):
        with pytest.raises(SystemExit, match=message):
            main(["serve", "--checkpoint", checkpoint, *flags])


@pytest.mark.slow
def test_a_missing_checkpoint_ends_the_process_with_its_error(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-m", "aiayn", "serve", "--checkpoint", str(tmp_path / "nothing"), "--port", "0"],
                         check=False, capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 1 and "nothing" in out.stderr and "listening on" in out.stdout
