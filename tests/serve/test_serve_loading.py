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
    """`aiayn serve --quantize` reaches the loader (int8-dynamic: a batch's rows share one activation range)."""
    import httpx

    from aiayn.cli.main import build_parser

    args = build_parser().parse_args(["serve", "--checkpoint", str(saved[0]), "--quantize", quantize])
    assert args.quantize == quantize
    server = serve(lambda: load_served_model(saved[0], quantize=args.quantize))
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "a cat", "max_tokens": 5, "seed": 0}, timeout=30)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1
