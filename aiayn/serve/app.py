"""The FastAPI app: OpenAI-style endpoints per model family, errors as OpenAI error objects, metrics,
and the page at ``/``. The model loads on a background thread after the server starts listening, so
a request that comes before it is ready gets a 503 rather than a refused connection.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from importlib import resources
from typing import Any

import torch
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException

from aiayn.nn.cache import KV_AUTO
from aiayn.serve import requests as checks
from aiayn.serve.capabilities import model_card, refusal, tokenizer_info
from aiayn.serve.choices import Choices, PlainChoices
from aiayn.serve.encoder_engine import EncoderEngine
from aiayn.serve.errors import APIError, error_body
from aiayn.serve.jobs import DONE, ERROR, TOKEN, Job, Worker
from aiayn.serve.lm_engine import LMEngine
from aiayn.serve.loading import ServedModel
from aiayn.serve.metrics import ServerMetrics
from aiayn.serve.middleware import BodyLimitAndMetrics
from aiayn.serve.schemas import (
    AttentionRequest,
    ClassificationRequest,
    CompletionRequest,
    DetokenizeRequest,
    FillMaskRequest,
    TokenizeRequest,
    TranslationRequest,
)
from aiayn.serve.seq2seq_engine import Seq2SeqEngine

__all__ = ["ENDPOINTS", "TOKENIZER_ENDPOINTS", "ServerState", "create_app"]

log = logging.getLogger(__name__)

ENDPOINTS = {
    "decoder-only": ["/v1/completions"],
    "encoder-decoder": ["/v1/translations", "/v1/attention"],
    "encoder-only": ["/v1/classifications", "/v1/fill-mask", "/v1/embeddings"],
}
TOKENIZER_ENDPOINTS = ["/tokenize", "/detokenize", "/tokenizer_info"]  # vLLM's, for every family
_ENGINES: dict[str, Callable[..., Worker]] = {"decoder-only": LMEngine, "encoder-decoder": Seq2SeqEngine, "encoder-only": EncoderEngine}


class ServerState:
    """The loaded model and its engine (``None`` until loaded), or why loading failed."""

    def __init__(
        self, metrics: ServerMetrics, *, max_batch: int, max_queue: int, max_request_tokens: int = 1 << 16,
        speculative: dict[str, Any] | None = None, kv_dtype: torch.dtype | str | None = KV_AUTO,
    ) -> None:
        self.metrics, self.max_batch, self.max_queue = metrics, max_batch, max_queue
        self.speculative = speculative  # LMEngine's speculative options (aiayn serve --speculative)
        self.kv_dtype = kv_dtype  # LMEngine's KV cache dtype (aiayn serve --kv-cache-dtype; "auto": the engine's decoder chooses)
        self.max_request_tokens = max_request_tokens
        self.served: ServedModel | None = None
        self.engine: Worker | None = None
        self.load_error: str | None = None
        self.created = int(time.time())

    def load(self, load: Callable[[], ServedModel], on_error: Callable[[BaseException], None] | None) -> None:
        try:
            served = load()
            options: dict[str, Any] = {}
            chosen_kv = None if self.kv_dtype == KV_AUTO else self.kv_dtype  # auto suits every family: it asks nothing
            for flag, given in (("--speculative", self.speculative), ("--kv-cache-dtype", chosen_kv)):
                if given is not None and served.family != "decoder-only":
                    raise ValueError(f"{flag} serves decoder-only models; this checkpoint holds a {served.family} model")
            if self.speculative is not None:
                options.update(self.speculative)
            if self.kv_dtype is not None and served.family == "decoder-only":
                options["kv_dtype"] = self.kv_dtype
            engine = _ENGINES[served.family](served, self.metrics, max_batch=self.max_batch, max_queue=self.max_queue, **options)
            engine.start()
            self.engine, self.served = engine, served
            log.info("model %s (%s) loaded", served.name, served.family)
        except BaseException as e:  # noqa: BLE001 (reported on /health and to the caller)
            self.load_error = f"{type(e).__name__}: {e}"
            log.error("the model failed to load: %s", self.load_error)
            if on_error is not None:
                on_error(e)

    def need(self, path: str | None) -> tuple[ServedModel, Worker]:
        """The model and engine for ``path``; 503 while loading or after a failed load, 404 for another family's
        endpoint, 400 for one this model cannot serve (e.g. fill-mask with a tokenizer that has no mask token).
        ``path=None``: the model whatever its endpoints (health, the model card, the tokenizer)."""
        if self.load_error is not None:
            raise APIError(503, f"the model failed to load: {self.load_error}", type="server_error", code="model_load_failed")
        if self.served is None or self.engine is None:
            raise APIError(503, "the model is still loading; retry in a moment", type="server_error", code="model_loading")
        if path is None:
            return self.served, self.engine
        if path not in ENDPOINTS[self.served.family]:
            raise APIError(404, f"{path} is not served for a {self.served.family} model; this server offers {ENDPOINTS[self.served.family]}",
                           code="unsupported_endpoint")
        why = refusal(self.served, path)
        if why is not None:
            raise APIError(400, f"{path} is not served for this model: {why}; this server offers {self.endpoints()}",
                           code="unsupported_endpoint")
        return self.served, self.engine

    def endpoints(self) -> list[str]:
        """The endpoints the loaded model serves (its family's, less those it cannot)."""
        if self.served is None:
            return []
        return [path for path in ENDPOINTS[self.served.family] if refusal(self.served, path) is None]

    def stop(self) -> None:
        if self.engine is not None:
            self.engine.stop()


def create_app(
    load: Callable[[], ServedModel],
    *,
    max_batch: int = 8,
    max_queue: int = 64,
    max_body_bytes: int = 1 << 20,
    max_request_tokens: int = 1 << 16,
    on_load_error: Callable[[BaseException], None] | None = None,
    body_timeout: float = 30.0,
    speculative: dict[str, Any] | None = None,
    kv_dtype: torch.dtype | str | None = KV_AUTO,
) -> FastAPI:
    """The app; ``load`` returns the model (see :func:`aiayn.serve.loading.load_served_model`) and runs
    once, on a thread, when the app starts. ``max_batch`` rows share a step; ``max_queue`` requests may
    wait (then 429); a body over ``max_body_bytes`` gets 413; a completion may ask for at most
    ``max_request_tokens`` tokens in all (prompts x ``best_of`` x ``max_tokens``), else 400; a body that has
    not arrived ``body_timeout`` seconds after the headers gets 408. ``speculative``: the decoder-only engine's
    speculative options (``{"speculative": "prompt-lookup", "draft_tokens": K, "ngram": N}``; see :class:`LMEngine`);
    ``kv_dtype``: the dtype its KV caches keep, ``None`` (the activations'), or ``"auto"`` (the default, as ``aiayn serve``'s
    and ``aiayn.load(...).generate``'s: bf16 for weight-only int8 and int4 weights; any family may take it)
    (:class:`~aiayn.decoding.adapters.CausalLMDecoder`)."""
    metrics = ServerMetrics()
    state = ServerState(metrics, max_batch=max_batch, max_queue=max_queue, max_request_tokens=max_request_tokens, speculative=speculative,
                        kv_dtype=kv_dtype)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        threading.Thread(target=state.load, args=(load, on_load_error), name="aiayn-load", daemon=True).start()
        yield
        await asyncio.to_thread(state.stop)

    app = FastAPI(title="aiayn serve", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.server = state
    known = {"/", "/health", "/metrics", "/v1/models", *TOKENIZER_ENDPOINTS, *(p for paths in ENDPOINTS.values() for p in paths)}
    app.add_middleware(BodyLimitAndMetrics, limit=max_body_bytes, metrics=metrics, endpoints=known, body_timeout=body_timeout)
    _add_error_handlers(app)

    @app.get("/", response_class=HTMLResponse)
    async def page() -> HTMLResponse:
        return HTMLResponse(resources.files("aiayn.serve").joinpath("page.html").read_text(encoding="utf-8"))

    @app.get("/health")
    async def health() -> dict[str, Any]:
        served, _ = state.need(None)
        return {"status": "ok", "model": served.name, "family": served.family}

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.text(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        served, _ = state.need(None)
        return {"object": "list", "data": [{
            "id": served.name, "object": "model", "created": state.created, "owned_by": "aiayn",
            "max_model_len": served.config.max_len, **model_card(served, state.endpoints()),
        }]}

    @app.get("/tokenizer_info")
    async def tokenizer_information() -> dict[str, Any]:
        served, _ = state.need(None)
        return tokenizer_info(served)

    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest) -> dict[str, Any]:
        served, _ = state.need(None)
        checks.check_model_name(body.model, served)
        ids = checks.tokenize(body, served)
        return {"tokens": ids, "count": len(ids), "max_model_len": served.config.max_len}

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest) -> dict[str, Any]:
        served, _ = state.need(None)
        checks.check_model_name(body.model, served)
        ids = checks.vocabulary(served, body.tokens, "tokens") if body.tokens else []
        return {"prompt": served.tgt_tokenizer.decode(ids)}

    @app.post("/v1/completions", response_model=None)
    async def completions(body: CompletionRequest) -> Any:
        served, engine = state.need("/v1/completions")
        checks.check_model_name(body.model, served)
        request = checks.completion(body, served, token_budget=state.max_request_tokens)
        job = _submit(engine, request, request.n_rows, body.stream)
        make = _completion_maker(served.name, "text_completion", "cmpl")
        include_usage = body.stream_options is not None and body.stream_options.include_usage
        shape = Choices(served, request, body.return_tokens_as_token_ids)
        return await _respond(job, make, body.stream, include_usage, shape)

    @app.post("/v1/translations", response_model=None)
    async def translations(body: TranslationRequest) -> Any:
        served, engine = state.need("/v1/translations")
        checks.check_model_name(body.model, served)
        job = _submit(engine, checks.translation(body, served), len(_as_list(body.text)), body.stream)
        return await _respond(job, _completion_maker(served.name, "translation", "tr"), body.stream, body.stream)

    @app.post("/v1/classifications")
    async def classifications(body: ClassificationRequest) -> dict[str, Any]:
        served, engine = state.need("/v1/classifications")
        checks.check_model_name(body.model, served)
        results = await _collect(_submit(engine, checks.classification(body, served), len(_as_list(body.input))))
        return {"object": "list", "model": served.name, "data": [{"object": "classification", "index": i, **r} for i, r in enumerate(results)]}

    @app.post("/v1/fill-mask")
    async def fill_mask(body: FillMaskRequest) -> dict[str, Any]:
        served, engine = state.need("/v1/fill-mask")
        checks.check_model_name(body.model, served)
        results = await _collect(_submit(engine, checks.fill_mask_request(body, served), len(_as_list(body.input))))
        return {"object": "list", "model": served.name, "data": [{"object": "fill_mask", "index": i, **r} for i, r in enumerate(results)]}

    @app.post("/v1/attention", response_class=HTMLResponse)
    async def attention(body: AttentionRequest) -> HTMLResponse:
        served, _ = state.need("/v1/attention")
        checks.check_model_name(body.model, served)
        return HTMLResponse(await asyncio.to_thread(_explorer, served, body.text, body.target))

    from aiayn.serve.embeddings import add_embeddings_route  # its own file; it uses this module's helpers, so imported here

    add_embeddings_route(app, state)
    return app


def _as_list(given: str | list[str]) -> list[str]:
    return [given] if isinstance(given, str) else given


def _submit(engine: Worker, payload: Any, n_outputs: int, stream: bool = False) -> Job:
    return engine.submit(Job(payload, n_outputs, asyncio.get_running_loop(), stream=stream))


async def _collect(job: Job) -> list[dict[str, Any]]:
    """Wait for every output of ``job``; raise its error. A cancelled handler cancels the job."""
    results: dict[int, dict[str, Any]] = {}
    try:
        while len(results) < job.n_outputs:
            event = await job.events.get()
            if event[0] == ERROR:
                raise event[1]
            if event[0] == DONE:
                results[event[1]] = event[2]
    finally:
        job.cancel()
    return [results[i] for i in range(job.n_outputs)]


def _completion_maker(model: str, kind: str, prefix: str) -> Callable[..., dict[str, Any]]:
    """Builds OpenAI-shaped bodies: ``make(choices, usage=None)`` with one id and timestamp per request."""
    ident, created = f"{prefix}-{uuid.uuid4().hex}", int(time.time())

    def make(choices: list[dict[str, Any]], usage: dict[str, int] | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"id": ident, "object": kind, "created": created, "model": model, "choices": choices}
        if usage is not None:
            body["usage"] = usage
        return body

    return make


async def _respond(job: Job, make: Callable[..., dict[str, Any]], stream: bool, include_usage: bool,
                   shape: PlainChoices | None = None) -> Any:
    shape = shape or PlainChoices()
    if not stream:
        results = await _collect(job)
        return make(shape.whole(results), shape.usage(results))
    try:
        first = await job.events.get()  # wait for the first event, so a failed prefill is still a proper 500
    except BaseException:
        job.cancel()
        raise
    if first[0] == ERROR:
        job.cancel()
        raise first[1]
    return StreamingResponse(_sse(job, first, make, include_usage, shape), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


async def _sse(job: Job, event: tuple[Any, ...], make: Callable[..., dict[str, Any]], include_usage: bool,
               shape: PlainChoices) -> AsyncIterator[str]:
    """Server-sent events: a chunk per piece of text, one with each choice's ``finish_reason``, then ``[DONE]``.
    When the client goes away the generator is closed, and ``finally`` frees the job's batch rows at once."""
    results: dict[int, dict[str, Any]] = {}
    try:
        while True:
            if event[0] == ERROR:
                yield f"data: {json.dumps(event[1].body())}\n\n"
                break
            if event[0] == TOKEN:
                yield f"data: {json.dumps(make([shape.piece(*event[1:])]))}\n\n"
            elif event[0] == DONE:
                results[event[1]] = event[2]
                yield f"data: {json.dumps(make([shape.last(event[1], event[2])]))}\n\n"
                if len(results) == job.n_outputs:
                    if include_usage:
                        yield f"data: {json.dumps(make([], shape.usage(list(results.values()))))}\n\n"
                    break
            event = await job.events.get()
        yield "data: [DONE]\n\n"
    finally:
        job.cancel()


def _explorer(served: ServedModel, text: str, target: str | None) -> str:
    from aiayn.viz.attention import collect_attention
    from aiayn.viz.explorer import explorer_html

    try:
        views, target = collect_attention(served.model, served.src_tokenizer, text, target=target, tgt_tokenizer=served.tgt_tokenizer)
    except ValueError as e:
        raise APIError(400, str(e), param="text") from None
    return explorer_html(views, title=f"attention of {served.name}", subtitle=f"{text} → {target}" if target else text)


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def api_error(request: Request, exc: APIError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse(_validation_body(exc.errors()), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 404:
            message = f"no such endpoint: {request.method} {request.url.path}"
        elif exc.status_code == 405:
            message = f"{request.method} is not allowed on {request.url.path}"
        else:
            message = str(exc.detail)
        code = {404: "not_found", 405: "method_not_allowed", 413: "body_too_large"}.get(exc.status_code)
        return JSONResponse(error_body(message, "invalid_request_error", None, code), status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error on %s", request.url.path)
        return JSONResponse(error_body(f"internal error: {type(exc).__name__}: {exc}", "server_error", None, "internal_error"), status_code=500)


def _validation_body(errors: Any) -> dict[str, Any]:
    """The first pydantic error as an OpenAI error: the field, the value and the rule (the limit)."""
    error = next(iter(errors))
    loc = [str(p) for p in error.get("loc", ()) if p != "body"]
    kind = error.get("type", "")
    if kind in ("json_invalid", "json_type"):
        detail = error.get("ctx", {}).get("error", error.get("msg", ""))
        return error_body(f"malformed JSON in the request body: {detail}", "invalid_request_error", None, "invalid_json")
    field = loc[0] if loc else None
    path = ".".join(loc) if loc else "body"
    if kind == "extra_forbidden":
        message = f"unknown field {path!r}: this endpoint does not take it"
    elif kind == "missing":
        message = f"{path} is required"
    else:
        message = f"{path}={error.get('input')!r}: {error.get('msg')}"
    return error_body(message, "invalid_request_error", field, "invalid_value" if kind != "extra_forbidden" else "unknown_field")
