"""An ASGI middleware in front of the app: a body over ``limit`` bytes gets 413 (before it is read
whole), a body not received within ``body_timeout`` seconds gets 408 (a client that stalls its body
would hold a connection and a task forever), and every request is counted once in the metrics with
its latency to the last byte: by its status, or ``disconnected`` when the client left first."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import HTTPException

from aiayn.serve.errors import error_body
from aiayn.serve.metrics import ServerMetrics

__all__ = ["BodyLimitAndMetrics", "BodyTooLarge", "BodyTimeout", "DISCONNECTED"]

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


DISCONNECTED = "disconnected"  # the status label of a request whose client went away before the last byte


class BodyTooLarge(HTTPException):
    def __init__(self, limit: int) -> None:
        super().__init__(413, f"the request body is over the limit of {limit} bytes (--max-body-bytes)")


class BodyTimeout(HTTPException):
    def __init__(self, timeout: float) -> None:
        super().__init__(408, f"the request body did not arrive within {timeout:g} s (--body-timeout)")


class BodyLimitAndMetrics:
    def __init__(
        self, app: Callable[..., Awaitable[None]], *, limit: int, metrics: ServerMetrics, endpoints: set[str],
        body_timeout: float = 30.0,
    ) -> None:
        self.app, self.limit, self.metrics, self.endpoints, self.body_timeout = app, limit, metrics, endpoints, body_timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        endpoint = scope["path"] if scope["path"] in self.endpoints else "other"  # bounded label values
        status, started, counted, gone = [500], [False], [False], [False]

        def count(label: str) -> None:
            if not counted[0]:  # once per request, whichever way it ends
                counted[0] = True
                self.metrics.requests.labels(endpoint, label).inc()
                self.metrics.latency.labels(endpoint).observe(time.perf_counter() - start)

        async def counting_send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status[0], started[0] = message["status"], True
                if message["status"] in (408, 413):  # the rest of the body is not read: end the connection
                    message = {**message, "headers": [*message.get("headers", []), (b"connection", b"close")]}
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                count(DISCONNECTED if gone[0] else str(status[0]))

        length = dict(scope.get("headers", [])).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.limit:
            await self._refuse(counting_send)
            return
        received, body_done = 0, False
        deadline = start + self.body_timeout

        async def limited_receive() -> dict[str, Any]:
            nonlocal received, body_done
            if body_done:  # the body is in: what remains is waiting for a disconnect, without a deadline
                message = await receive()
            else:
                try:
                    message = await asyncio.wait_for(receive(), max(deadline - time.perf_counter(), 0.0))
                except asyncio.TimeoutError:
                    raise BodyTimeout(self.body_timeout) from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:  # a chunked body with no Content-Length
                    raise BodyTooLarge(self.limit)
                body_done = not message.get("more_body", False)
            elif message["type"] == "http.disconnect":
                gone[0] = True
            return message

        try:
            await self.app(scope, limited_receive, counting_send)
        finally:
            count(DISCONNECTED if gone[0] or started[0] else "500")  # a stream cut short, or an error outside

    async def _refuse(self, send: Send) -> None:
        body = json.dumps(error_body(BodyTooLarge(self.limit).detail, "invalid_request_error", None, "body_too_large")).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})
