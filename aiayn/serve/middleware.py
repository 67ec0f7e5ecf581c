"""An ASGI middleware in front of the app: a body over ``limit`` bytes gets 413 (before it is read
whole), and every response is counted in the metrics with its latency to the last byte."""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import HTTPException

from aiayn.serve.errors import error_body
from aiayn.serve.metrics import ServerMetrics

__all__ = ["BodyLimitAndMetrics", "BodyTooLarge"]

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


class BodyTooLarge(HTTPException):
    def __init__(self, limit: int) -> None:
        super().__init__(413, f"the request body is over the limit of {limit} bytes (--max-body-bytes)")


class BodyLimitAndMetrics:
    def __init__(self, app: Callable[..., Awaitable[None]], *, limit: int, metrics: ServerMetrics, endpoints: set[str]) -> None:
        self.app, self.limit, self.metrics, self.endpoints = app, limit, metrics, endpoints

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        endpoint = scope["path"] if scope["path"] in self.endpoints else "other"  # bounded label values
        status = [500]

        async def counting_send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                self.metrics.requests.labels(endpoint, str(status[0])).inc()
                self.metrics.latency.labels(endpoint).observe(time.perf_counter() - start)

        length = dict(scope.get("headers", [])).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.limit:
            await self._refuse(counting_send)
            return
        received = 0

        async def limited_receive() -> dict[str, Any]:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:  # a chunked body with no Content-Length
                    raise BodyTooLarge(self.limit)
            return message

        await self.app(scope, limited_receive, counting_send)

    async def _refuse(self, send: Send) -> None:
        body = json.dumps(error_body(BodyTooLarge(self.limit).detail, "invalid_request_error", None, "body_too_large")).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})
