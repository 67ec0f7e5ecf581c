"""Fuzzing the HTTP API from its own OpenAPI schema (schemathesis): valid and invalid requests to every
endpoint of every family, a fixed number of examples each; no 500 and no traceback on any of them."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi", reason="needs the serve extra (pip install aiayn[serve])")
schemathesis = pytest.importorskip("schemathesis", reason="needs schemathesis (the dev extra)")
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from reliability_server import start, stop

from aiayn import build_model
from aiayn.serve.app import ENDPOINTS, create_app
from aiayn.serve.loading import ServedModel
from aiayn.tokenization import CharTokenizer

pytestmark = pytest.mark.reliability
EXAMPLES = 8  # per endpoint and mode (valid, invalid): fixed, so the test is bounded
PRESETS = {"decoder-only": "tiny-decoder-only", "encoder-decoder": "tiny-encoder-decoder", "encoder-only": "tiny-encoder-only"}


def _serve(family: str):
    tokenizer = CharTokenizer.train(["a cat sat on the mat", "the dog ran"])
    torch.manual_seed(0)
    model = build_model(PRESETS[family], vocab_size=tokenizer.vocab_size, max_len=48, **({"n_classes": 2} if family == "encoder-only" else {})).eval()
    served = ServedModel(model, model.config, tokenizer, tokenizer, "tiny")
    app = create_app(lambda: served, max_batch=4, max_queue=16, max_request_tokens=64)  # big asks get a quick 400
    return (*start(app, header_timeout=5, max_connections=64), app.openapi())


@pytest.mark.parametrize("family", sorted(ENDPOINTS))
def test_no_generated_request_gets_a_500_or_a_traceback(family):
    server, thread, url, spec = _serve(family)
    try:
        schema = schemathesis.openapi.from_dict(spec)
        operations = [result.ok() for result in schema.get_all_operations()]
        paths = {op.path for op in operations}
        assert set(ENDPOINTS[family]) <= paths  # the family's endpoints are in the schema, so they are fuzzed
        failures: list[str] = []
        # The family's own endpoints, and the GET ones (/health, /v1/models, /metrics, /) once; another family's
        # endpoints answer 404 after the same validation.
        shared = family == "decoder-only"
        for operation in [op for op in operations if op.path in ENDPOINTS[family] or (shared and op.method == "get")]:
            _fuzz(operation, operation.as_strategy(generation_mode=schemathesis.GenerationMode.POSITIVE), url, failures)
            try:
                _fuzz(operation, operation.as_strategy(generation_mode=schemathesis.GenerationMode.NEGATIVE), url, failures)
            except Unsatisfiable:  # an operation without parameters or body has no invalid input
                assert operation.method == "get", operation.path
        assert not failures, "\n".join(failures[:10])
    finally:
        stop(server, thread)


def _fuzz(operation, strategy, url: str, failures: list[str]) -> None:
    @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(case=strategy)
    def fuzz(case):
        response = case.call(base_url=url, timeout=30)
        if response.status_code >= 500 or "Traceback" in response.text:
            failures.append(f"{operation.method.upper()} {operation.path} {case.body!r:.300} -> "
                            f"{response.status_code} {response.text[:300]}")

    fuzz()
