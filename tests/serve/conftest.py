"""Servers for the tests (made by :mod:`servers`), always shut down (with a timeout) when the test ends."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch

pytest.importorskip("fastapi", reason="needs the serve extra (pip install aiayn[serve])")
from servers import TEXTS, Running, served_model, start_server, stop_server  # noqa: E402

from aiayn.serve.loading import ServedModel  # noqa: E402
from aiayn.tokenization import CharTokenizer  # noqa: E402


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models step by step: intra-op threads only add contention on a shared machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tokenizer() -> CharTokenizer:
    return CharTokenizer.train(TEXTS)


@pytest.fixture()
def serve() -> Iterator[Callable[..., Running]]:
    """``serve(load_or_served, **create_app_options)`` starts a server; every one is stopped at the end."""
    started: list[Running] = []

    def start(what, **options) -> Running:
        load = what if callable(what) else (lambda: what)
        running = start_server(load, **options)
        started.append(running)
        return running

    yield start
    for running in started:
        stop_server(running)


@pytest.fixture(scope="module")
def lm_model(tokenizer) -> ServedModel:
    return served_model(tokenizer, "tiny-decoder-only", max_len=64)
