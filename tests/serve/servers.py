"""The servers and models of the serve tests: tiny models made here, the app on uvicorn in a thread on 127.0.0.1, a
free port. A module of its own (not conftest): test modules import it by a name no other test folder uses."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx
import torch
import uvicorn

from aiayn import build_model
from aiayn.serve.app import create_app
from aiayn.serve.loading import ServedModel
from aiayn.tokenization import CharTokenizer

TEXTS = ["a cat sat on the mat", "the dog ran", "hello world.", "ZQX!?"]



def served_model(tokenizer: CharTokenizer, preset: str, name: str = "tiny", **overrides) -> ServedModel:
    torch.manual_seed(0)
    model = build_model(preset, vocab_size=tokenizer.vocab_size, **overrides).eval()
    return ServedModel(model, model.config, tokenizer, tokenizer, name)


@dataclass
class Running:
    url: str
    app: object
    server: uvicorn.Server
    thread: threading.Thread

    def client(self, timeout: float = 30.0) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=timeout)


def start_server(load: Callable[[], ServedModel], *, wait_ready: bool = True, **options) -> Running:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    app = create_app(load, **options)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=2, access_log=False))
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])), daemon=True)
    thread.start()
    running = Running(f"http://127.0.0.1:{sock.getsockname()[1]}", app, server, thread)
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.01)
    if wait_ready:
        while time.monotonic() < deadline:
            try:
                if httpx.get(running.url + "/health", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.02)
        else:
            raise RuntimeError("the test server did not become ready in 30 s")
    return running


def stop_server(running: Running) -> None:
    running.server.should_exit = True
    running.thread.join(timeout=15)
    assert not running.thread.is_alive(), "the server did not shut down in 15 s"
