"""``POST /v1/embeddings`` through the ``openai`` client and httpx: the vectors equal ``aiayn.load(dir).embed``
(text or token ids, float or base64, alone or batched with other requests), the pooling of a directory's
sentence-transformers files is followed, and bad requests get a 400 naming the field, value and limit."""

from __future__ import annotations

import base64
import concurrent.futures
import json

import httpx
import numpy as np
import pytest
import torch
from servers import served_model, start_server, stop_server

import aiayn
from aiayn.inference.embed import embed_texts, embedding_pooling
from aiayn.pretrained import save_pretrained
from aiayn.serve.loading import load_served_model

openai = pytest.importorskip("openai")

TEXTS = ["a cat sat", "the dog ran on the mat", "hello"]


@pytest.fixture(scope="module")
def bert(tokenizer):
    return served_model(tokenizer, "tiny-encoder-only", name="tiny-bert", max_len=32)


@pytest.fixture(scope="module")
def server(bert):
    """One server for the module's requests to the tiny encoder (each server costs a start and a stop)."""
    running = start_server(lambda: bert)
    yield running
    stop_server(running)


def expected(served, texts):
    return embed_texts(served.model, served.src_tokenizer, texts, embedding_pooling(served.model))


def test_the_openai_client_gets_the_library_embeddings(server, bert):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=30)
    out = client.embeddings.create(model="tiny-bert", input=TEXTS)  # the client asks for base64 and decodes it
    assert [d.index for d in out.data] == [0, 1, 2] and out.model == "tiny-bert"
    assert torch.tensor([d.embedding for d in out.data]) == pytest.approx(expected(bert, TEXTS), abs=1e-6)
    assert out.usage.prompt_tokens == out.usage.total_tokens == sum(len(t) + 2 for t in TEXTS)  # [CLS] text [SEP], by character
    # alone or in a batch of three: the same vector up to rounding (MKL's AVX2 kernels round by batch shape)
    alone = client.embeddings.create(input="hello", model="tiny-bert", dimensions=32).data[0].embedding
    assert alone == pytest.approx(out.data[2].embedding, abs=1e-6)


def test_token_ids_float_and_base64_and_batching_agree(server, bert):
    ids = [bert.src_tokenizer.encode(t) for t in TEXTS]

    def post(body):
        r = httpx.post(server.url + "/v1/embeddings", json=body, timeout=30)
        assert r.status_code == 200, r.text
        return r.json()["data"]

    floats = [d["embedding"] for d in post({"input": TEXTS, "encoding_format": "float"})]
    assert torch.tensor(floats) == pytest.approx(expected(bert, TEXTS), abs=1e-6)
    assert [d["embedding"] for d in post({"input": ids})] == floats
    assert post({"input": ids[1]})[0]["embedding"] == floats[1]
    packed = post({"input": TEXTS, "encoding_format": "base64"})
    assert [np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4").tolist() for d in packed] == floats
    with concurrent.futures.ThreadPoolExecutor(3) as pool:  # requests that wait together share a forward pass
        together = list(pool.map(lambda t: post({"input": t})[0]["embedding"], TEXTS))
    assert torch.tensor(together) == pytest.approx(torch.tensor(floats), abs=1e-6)
    models = httpx.get(server.url + "/v1/models").json()["data"][0]
    assert "/v1/embeddings" in models["endpoints"]


def test_a_directory_with_sentence_transformers_files_pools_as_they_say(serve, bert, tmp_path):
    directory = save_pretrained(tmp_path / "st-bert", bert.model, bert.src_tokenizer)
    (directory / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]))
    (directory / "1_Pooling").mkdir()
    (directory / "1_Pooling" / "config.json").write_text(json.dumps({"embedding_dimension": 32, "pooling_mode": "cls"}))
    server = serve(lambda: load_served_model(directory, name="st-bert"))
    data = httpx.post(server.url + "/v1/embeddings", json={"input": TEXTS}, timeout=30).json()["data"]
    ours = aiayn.load(directory).embed(TEXTS)  # [CLS], not normalised: what the files say
    assert torch.tensor([d["embedding"] for d in data]) == pytest.approx(ours, abs=1e-6)
    assert not torch.allclose(ours, expected(bert, TEXTS), atol=1e-3)


@pytest.mark.parametrize("body, param, words", [
    ({"input": "hello", "dimensions": 8}, "dimensions", "dimensions=8 must be 32, this model's embedding size"),
    ({"input": [[7, 9999]]}, "input[0][1]", "input[0][1]=9999 is outside the vocabulary: token ids must be in 0..27"),
    ({"input": [3, -1]}, "input[1]", "input[1]=-1 is outside the vocabulary"),
    ({"input": "a cat sat on the mat and the dog ran"}, "input", "has 38 tokens with [CLS] and [SEP]: this model embeds at most 32"),
    ({"input": ["a", ""]}, "input[1]", "is empty"),
    ({"input": []}, "input", "is empty"),
    ({"input": [[]]}, "input[0]", "is empty"),
    ({"input": ["a"] * 65}, "input", "at most 64"),
    ({"input": "a", "encoding_format": "int8"}, "encoding_format", "'float' or 'base64'"),
    ({"input": [1.5]}, "input", None),
])
def test_bad_requests_name_the_field_the_value_and_the_limit(server, body, param, words):
    r = httpx.post(server.url + "/v1/embeddings", json=body, timeout=30)
    error = r.json()["error"]
    assert r.status_code == 400 and error["param"] == param and error["type"] == "invalid_request_error", r.text
    assert words is None or words in error["message"], error["message"]


def test_an_embedding_request_to_a_decoder_only_model_is_a_400_naming_the_model(serve, lm_model):
    server = serve(lm_model)
    r = httpx.post(server.url + "/v1/embeddings", json={"input": "a cat"}, timeout=30)
    error = r.json()["error"]
    assert r.status_code == 400 and error["param"] == "model" and error["code"] == "unsupported_model"
    assert "model='tiny' is a decoder-only model: /v1/embeddings needs an encoder-only model" in error["message"]
