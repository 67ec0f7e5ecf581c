"""uvicorn's server with the limits a public port needs, and a quiet exit.

- A header timeout: uvicorn closes an idle keep-alive connection, but one that opens and then sends
  its request line and headers slowly (or never) is held forever. :class:`Protocol` closes a
  connection whose headers are not in ``header_timeout`` seconds after it opened or after its last
  response (the body's own deadline is :class:`~aiayn.serve.middleware.BodyLimitAndMetrics`'s).
- A cap on open connections (uvicorn's ``limit_concurrency``: past it a request gets 503).
- After a graceful shutdown on SIGTERM or Ctrl-C the process ends normally (exit status 0, no
  ``KeyboardInterrupt`` trace) instead of re-raising the signal.
"""

from __future__ import annotations

import asyncio
from types import FrameType
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = ["Server", "Protocol", "server_config"]


class Server(uvicorn.Server):
    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        self._captured_signals.clear()  # uvicorn would raise the signal again once shut down


class Protocol(H11Protocol):
    """uvicorn's HTTP/1.1 protocol with a deadline for each request's headers (``header_timeout``)."""

    header_timeout: float  # set by server_config

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._header_timer: asyncio.TimerHandle | None = None
        self._arm()

    def data_received(self, data: bytes) -> None:
        cycle = self.cycle
        super().data_received(data)
        if self.cycle is not cycle:  # the headers of a new request are in
            self._disarm()

    def on_response_complete(self) -> None:
        cycle = self.cycle
        super().on_response_complete()
        if self.cycle is cycle and not self.transport.is_closing():  # waiting for the next request's headers
            self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self._header_timer = self.loop.call_later(self.header_timeout, self._headers_late)

    def _disarm(self) -> None:
        if getattr(self, "_header_timer", None) is not None:
            self._header_timer.cancel()  # type: ignore[union-attr]
            self._header_timer = None

    def _headers_late(self) -> None:
        self._header_timer = None
        if not self.transport.is_closing():
            self.transport.close()  # no request to answer: the headers never came


def server_config(app: Any, *, header_timeout: float, max_connections: int, **options: Any) -> uvicorn.Config:
    """uvicorn's config for ``app`` with :class:`Protocol` (``header_timeout``) and ``max_connections``
    open at once (more get 503); ``options`` go to ``uvicorn.Config``."""
    protocol = type("Protocol", (Protocol,), {"header_timeout": header_timeout})
    return uvicorn.Config(app, http=protocol, limit_concurrency=max_connections, **options)
