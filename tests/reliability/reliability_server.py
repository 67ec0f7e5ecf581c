"""The app on aiayn's own uvicorn server (its timeouts and connection cap) in a thread on 127.0.0.1, for
the reliability tests of the server; ready when it returns."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from typing import Any

import httpx

from aiayn.serve.server import Server, server_config


def start(app: Any, **limits: Any) -> tuple[Server, threading.Thread, str]:
    """Serve ``app`` with ``server_config(app, **limits)``; returns (server, its thread, its URL) once /health is 200."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = Server(server_config(app, log_level="critical", timeout_graceful_shutdown=2, access_log=False, **limits))
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])), daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return server, thread, url
        except httpx.TransportError:
            pass
        time.sleep(0.02)
    stop(server, thread)
    raise RuntimeError("the server did not become ready in 30 s")


def stop(server: Server, thread: threading.Thread) -> None:
    server.should_exit = True
    thread.join(timeout=15)
    assert not thread.is_alive(), "the server did not shut down in 15 s"
