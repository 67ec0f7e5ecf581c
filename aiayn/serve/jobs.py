"""A request as the model worker sees it (:class:`Job`), and the worker thread every engine runs.

The HTTP side lives on the asyncio loop; the model runs on one worker thread (PyTorch releases the
GIL inside its kernels). A job's events cross over with ``loop.call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from typing import Any

from aiayn.serve.errors import APIError
from aiayn.serve.metrics import ServerMetrics

__all__ = ["DONE", "ERROR", "TOKEN", "Job", "Worker"]

log = logging.getLogger(__name__)

TOKEN, DONE, ERROR = "token", "done", "error"


class Job:
    """One HTTP request's work: ``payload`` (engine-specific), an event queue read by the handler;
    ``stream``: the client reads the text as it comes (else TOKEN events are not sent).

    Events are tuples: ``(TOKEN, index, text)``, ``(DONE, index, result)`` once per output row,
    ``(ERROR, APIError)`` once (then nothing more).
    """

    def __init__(self, payload: Any, n_outputs: int, loop: asyncio.AbstractEventLoop, *, stream: bool = False) -> None:
        self.payload, self.n_outputs, self.loop, self.stream = payload, n_outputs, loop, stream
        self.events: asyncio.Queue[tuple[Any, ...]] = asyncio.Queue()
        self.cancelled = threading.Event()
        self.failed = False
        self.arrived = time.perf_counter()
        self.first_token_at: float | None = None

    def emit(self, *event: Any) -> None:
        """Hand an event to the handler (thread-safe; dropped once the loop is gone or the job cancelled)."""
        if self.cancelled.is_set():
            return
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the event loop closed: the server is shutting down
            self.cancelled.set()

    def fail(self, error: APIError) -> None:
        if not self.failed:
            self.failed = True
            self.emit(ERROR, error)

    def cancel(self) -> None:
        """The client went away: the worker drops this job at its next step."""
        self.cancelled.set()

    @property
    def dead(self) -> bool:
        return self.failed or self.cancelled.is_set()


class Worker:
    """A thread that takes jobs from a bounded queue and runs them (``_work``, defined by each engine)."""

    name = "worker"

    def __init__(self, metrics: ServerMetrics, *, max_batch: int, max_queue: int) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if max_queue < 1:
            raise ValueError(f"max_queue must be >= 1, got {max_queue}")
        self.metrics, self.max_batch, self.max_queue = metrics, max_batch, max_queue
        self.pending: deque[Job] = deque()
        self.wake = threading.Condition()
        self.stopping = False
        self.thread = threading.Thread(target=self._loop, name=f"aiayn-{self.name}", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def submit(self, job: Job) -> Job:
        """Queue ``job``; raise a 429 :class:`APIError` when ``max_queue`` jobs already wait, 503 when stopping."""
        with self.wake:
            if self.stopping:
                raise APIError(503, "the server is shutting down", type="server_error", code="shutting_down")
            if len(self.pending) >= self.max_queue:
                raise APIError(429, f"the queue is full ({self.max_queue} requests wait, --max-queue={self.max_queue}); retry later",
                               type="rate_limit_error", code="queue_full")
            self.pending.append(job)
            self.metrics.queue_depth.set(len(self.pending))
            self.wake.notify()
        return job

    def take(self, limit: int, block: bool) -> list[Job]:
        """Up to ``limit`` live jobs from the queue (waiting for one if ``block``); cancelled ones are dropped."""
        with self.wake:
            if block:
                while not self.pending and not self.stopping:
                    self.wake.wait(timeout=0.5)
            taken: list[Job] = []
            while self.pending and len(taken) < limit:
                job = self.pending.popleft()
                if not job.dead:
                    taken.append(job)
            self.metrics.queue_depth.set(len(self.pending))
            return taken

    def stop(self, timeout: float = 10.0) -> None:
        """Refuse new jobs, fail the waiting ones with 503, let the thread finish its current work."""
        with self.wake:
            self.stopping = True
            waiting, self.pending = list(self.pending), deque()
            self.wake.notify_all()
        for job in waiting:
            job.fail(APIError(503, "the server is shutting down", type="server_error", code="shutting_down"))
        if self.thread.is_alive():
            self.thread.join(timeout)

    def _loop(self) -> None:
        while not self.stopping:
            try:
                self._work()
            except Exception:  # a bug in the engine itself: log it and keep serving
                log.exception("%s: unexpected error", self.name)
                time.sleep(0.01)
        self._shutdown()

    def _work(self) -> None:
        raise NotImplementedError

    def _shutdown(self) -> None:
        """Called on the worker thread once stopping: fail what is still running."""
