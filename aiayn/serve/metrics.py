"""The server's Prometheus metrics (``GET /metrics``), one registry per app so tests do not share counts."""

from __future__ import annotations

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

__all__ = ["ServerMetrics"]

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class ServerMetrics:
    """Requests, tokens, queue depth, running rows, time to first token and latency."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("aiayn_requests", "HTTP requests, by endpoint and status (an HTTP status, or 'disconnected': the client left before the last byte)", ["endpoint", "status"], registry=self.registry)
        self.tokens = Counter("aiayn_tokens", "tokens processed, by kind (prompt or completion)", ["kind"], registry=self.registry)
        self.queue_depth = Gauge("aiayn_queue_depth", "requests waiting for a batch slot", registry=self.registry)
        self.running = Gauge("aiayn_running", "sequences in the running batch", registry=self.registry)
        self.time_to_first_token = Histogram(
            "aiayn_time_to_first_token_seconds", "from a request's arrival to its first generated token",
            buckets=_LATENCY_BUCKETS, registry=self.registry,
        )
        self.latency = Histogram(
            "aiayn_request_latency_seconds", "from a request's arrival to its last byte, by endpoint", ["endpoint"],
            buckets=_LATENCY_BUCKETS, registry=self.registry,
        )

    def text(self) -> bytes:
        return generate_latest(self.registry)
