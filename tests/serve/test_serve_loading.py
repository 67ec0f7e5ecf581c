"""The one loading function of the server: dtype applied, tokenizers required, bad values named."""

from __future__ import annotations

import pytest
import torch

from aiayn import build_model
from aiayn.pretrained import save_pretrained
from aiayn.serve.loading import load_served_model


@pytest.fixture(scope="module")
def saved(tmp_path_factory, tokenizer):
    torch.manual_seed(0)
    model = build_model("tiny-decoder-only", vocab_size=tokenizer.vocab_size).eval()
    directory = tmp_path_factory.mktemp("loading")
    return save_pretrained(directory / "lm", model, tokenizer), save_pretrained(directory / "bare", model)


def test_dtype_name_and_family(saved):
    served = load_served_model(saved[0], dtype="bfloat16")
    assert {p.dtype for p in served.model.parameters()} == {torch.bfloat16}
    assert served.name == "lm" and served.family == "decoder-only" and not served.model.training
    assert load_served_model(saved[0], name="shakespeare").name == "shakespeare"


def test_refusals_name_the_problem(saved, tmp_path):
    with pytest.raises(ValueError, match="dtype must be one of .* got 'float8'"):
        load_served_model(saved[0], dtype="float8")
    with pytest.raises(ValueError, match="holds no tokenizer"):
        load_served_model(saved[1])
    with pytest.raises(FileNotFoundError, match="nothing"):
        load_served_model(tmp_path / "nothing")


def test_a_bfloat16_server_completes(serve, saved):
    server = serve(lambda: load_served_model(saved[0], dtype="bfloat16"))
    import httpx

    r = httpx.post(server.url + "/v1/completions", json={"prompt": "a cat", "max_tokens": 5, "seed": 0}, timeout=30)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1


@pytest.mark.parametrize("quantize", ["int8", "int8-dynamic", "int4"])
def test_a_quantised_server_completes(serve, saved, quantize):
    """`aiayn serve --quantize` reaches the loader (int8-dynamic: a batch's rows share one activation range); the library's
    `create_app` keeps the KV cache as `aiayn serve` does by default (`auto`: bf16 for weight-only int8 and int4)."""
    import httpx

    from aiayn.cli.main import build_parser

    args = build_parser().parse_args(["serve", "--checkpoint", str(saved[0]), "--quantize", quantize])
    assert args.quantize == quantize
    server = serve(lambda: load_served_model(saved[0], quantize=args.quantize))
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "a cat", "max_tokens": 5, "seed": 0}, timeout=30)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1
    assert server.app.state.server.engine.decoder.kv_dtype == (None if quantize == "int8-dynamic" else torch.bfloat16)


def test_a_server_with_a_bf16_kv_cache_completes_concurrent_requests(serve, saved, tokenizer, monkeypatch):
    """`aiayn serve --kv-cache-dtype bf16` reaches the engine's decoder; rows prefilled apart and joined into one batch
    keep their caches in bf16 (every write after a join is in the joined cache's dtype); a model of another family is
    refused, naming the flag."""
    import concurrent.futures
    import time

    import httpx
    from servers import served_model

    from aiayn.cli.main import build_parser
    from aiayn.inference.precision import parse_dtype
    from aiayn.serve import batch_state
    from aiayn.serve.app import ServerState
    from aiayn.serve.metrics import ServerMetrics

    args = build_parser().parse_args(["serve", "--checkpoint", str(saved[0]), "--kv-cache-dtype", "bf16"])
    server = serve(lambda: load_served_model(saved[0]), kv_dtype=parse_dtype(args.kv_cache_dtype))
    engine = server.app.state.server.engine
    assert engine.decoder.kv_dtype == torch.bfloat16
    written, joins = set(), []  # the caches' dtypes after each step (a step slowed, so that the requests overlap)
    step, join = engine.decoder.step, batch_state.join

    def slow_step(tokens, state):
        time.sleep(0.02)
        logits = step(tokens, state)
        written.update(layer.k.dtype for layer in state.cache.self_attn)
        return logits

    monkeypatch.setattr(engine.decoder, "step", slow_step)
    monkeypatch.setattr(batch_state, "join", lambda *a: joins.append(1) or join(*a))
    bodies = [{"prompt": p, "max_tokens": 8, "seed": 0, "temperature": 0} for p in ("a cat", "the dog sat", "hello")]
    with httpx.Client(timeout=60) as client, concurrent.futures.ThreadPoolExecutor(3) as pool:
        replies = list(pool.map(lambda body: client.post(server.url + "/v1/completions", json=body), bodies))
    assert all(r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1 for r in replies)
    assert joins and written == {torch.bfloat16}
    errors: list[BaseException] = []
    state = ServerState(ServerMetrics(), max_batch=2, max_queue=2, kv_dtype=torch.bfloat16)
    state.load(lambda: served_model(tokenizer, "tiny-encoder-only"), errors.append)
    assert state.load_error is not None and "--kv-cache-dtype serves decoder-only models; this checkpoint holds a encoder-only model" in state.load_error
    assert build_parser().parse_args(["serve", "--checkpoint", str(saved[0])]).kv_cache_dtype == "auto"  # the default
    state = ServerState(ServerMetrics(), max_batch=2, max_queue=2, kv_dtype="auto")  # asks nothing of another family
    state.load(lambda: served_model(tokenizer, "tiny-encoder-only"), errors.append)
    assert state.load_error is None and state.engine is not None
    state.engine.stop()
