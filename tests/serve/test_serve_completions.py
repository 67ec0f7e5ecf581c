"""``POST /v1/completions`` through the official ``openai`` client against a server on 127.0.0.1: the
text equals ``generate`` run alone in process with the same seed, streamed or not, alone or in a batch."""

from __future__ import annotations

import concurrent.futures

import pytest
from serve_helpers import reference_completion, sse_events

openai = pytest.importorskip("openai")


@pytest.fixture()
def lm_server(serve, lm_model):
    return serve(lm_model)


def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=30)


def test_completion_matches_generate_in_process(lm_server, lm_model):
    out = client(lm_server).completions.create(model="tiny", prompt="a cat", max_tokens=12, seed=7, temperature=0.8, top_p=0.9)
    text, reason = reference_completion(lm_model, "a cat", 12, 7, 0.8, 0.9)
    assert out.choices[0].text == text and out.choices[0].finish_reason == reason
    assert out.object == "text_completion" and out.model == "tiny"
    assert out.usage.prompt_tokens == 5 and out.usage.completion_tokens == 12 and out.usage.total_tokens == 17


def test_prompt_list_and_greedy(lm_server, lm_model):
    prompts = ["a cat", "the dog ran", "h"]
    out = client(lm_server).completions.create(model="tiny", prompt=prompts, max_tokens=6, temperature=0, seed=1)
    assert [c.index for c in out.choices] == [0, 1, 2]
    assert [c.text for c in out.choices] == [reference_completion(lm_model, p, 6, 1, temperature=0)[0] for p in prompts]


def test_streamed_completion_equals_the_whole(lm_server, lm_model):
    stream = client(lm_server).completions.create(model="tiny", prompt="hello", max_tokens=15, seed=3, stream=True,
                                                   stream_options={"include_usage": True})
    chunks = list(stream)
    pieces = [c.choices[0].text for c in chunks if c.choices]
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    text, reason = reference_completion(lm_model, "hello", 15, 3)
    assert "".join(pieces) == text and reasons == [reason]
    assert len([p for p in pieces if p]) > 1  # it did stream
    assert chunks[-1].usage.completion_tokens == 15


def test_stream_ends_with_done(lm_server):
    import httpx

    with httpx.stream("POST", lm_server.url + "/v1/completions", json={"prompt": "a", "max_tokens": 4, "stream": True, "seed": 0}, timeout=30) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        events = sse_events(r.iter_lines())
    assert events[-1] == "[DONE]" and events[-2]["choices"][0]["finish_reason"] in ("stop", "length")


def test_stop_string_cuts_the_text(lm_server, lm_model):
    full, _ = reference_completion(lm_model, "a cat", 20, 5)
    stop = next((full[i:i + 2] for i in range(2, len(full) - 1) if full[i:i + 2].strip() == full[i:i + 2]), None)
    if stop is None:
        pytest.skip("the reference text has no usable stop string")
    out = client(lm_server).completions.create(model="tiny", prompt="a cat", max_tokens=20, seed=5, stop=stop)
    assert out.choices[0].text == full[: full.index(stop)] and out.choices[0].finish_reason == "stop"


def test_a_request_gets_the_same_tokens_alone_and_in_a_batch(serve, lm_model):
    """Seeded sampling, 6 concurrent requests sharing steps (max_batch=8) vs each alone: identical text."""
    server = serve(lm_model, max_batch=8)
    c = client(server)
    prompts = ["a cat", "the dog ran on", "h", "world.", "sat on the mat", "ZQ"]
    alone = [c.completions.create(model="tiny", prompt=p, max_tokens=20 + 3 * i, seed=100 + i).choices[0].text for i, p in enumerate(prompts)]
    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        together = list(pool.map(lambda ip: c.completions.create(model="tiny", prompt=ip[1], max_tokens=20 + 3 * ip[0], seed=100 + ip[0]).choices[0].text,
                                 enumerate(prompts)))
    assert together == alone
    assert alone == [reference_completion(lm_model, p, 20 + 3 * i, 100 + i)[0] for i, p in enumerate(prompts)]


def test_logit_bias(lm_server, tokenizer):
    z = tokenizer.encode("Z")[0]
    out = client(lm_server).completions.create(model="tiny", prompt="a cat", max_tokens=10, seed=2, logit_bias={str(z): 100})
    assert out.choices[0].text == "Z" * 10
    with pytest.raises(openai.BadRequestError, match="logit_bias"):
        client(lm_server).completions.create(model="tiny", prompt="a", max_tokens=2, logit_bias={"99999": 1})


@pytest.mark.parametrize("kwargs, param, words", [
    ({"max_tokens": 0}, "max_tokens", ["max_tokens=0", "echo"]),
    ({"max_tokens": 70000}, "max_tokens", ["70000", "budget of 65536 tokens"]),
    ({"n": 3, "max_tokens": 30000}, "max_tokens", ["90000", "n/best_of=3", "budget of 65536"]),
    ({"prompt": []}, "prompt", ["empty"]),
    ({"prompt": [[1, 2], [3, 99999]]}, "prompt[1][1]", ["99999", "outside the vocabulary", "0.."]),
    ({"temperature": -0.5}, "temperature", ["temperature=-0.5", "temperature 0"]),
    ({"top_p": 0}, "top_p", ["top_p=0", "(0, 1]"]),
    ({"top_p": 1.5}, "top_p", ["top_p=1.5", "(0, 1]"]),
    ({"extra_body": {"top_k": 0}}, "top_k", ["top_k=0", ">= 1"]),
    ({"presence_penalty": 3}, "presence_penalty", ["presence_penalty=3", "[-2, 2]"]),
    ({"logprobs": 21}, "logprobs", ["logprobs=21", "at most 20"]),
    ({"n": 2, "best_of": 1}, "best_of", ["best_of=1", ">= n=2"]),
    ({"n": 21}, "n", ["21", "less than or equal to 20"]),
    ({"extra_body": {"colour": "red"}}, "colour", ["unknown field", "colour"]),
])
def test_bad_fields_get_400_naming_field_value_and_limit(lm_server, kwargs, param, words):
    c = client(lm_server)
    body = {"model": "tiny", "prompt": "a cat", "max_tokens": 4, **kwargs}
    with pytest.raises(openai.BadRequestError) as info:
        c.completions.create(**body)
    error = info.value.body
    assert info.value.status_code == 400 and error["param"] == param and error["type"] == "invalid_request_error"
    assert all(w in error["message"] for w in words), error["message"]
    assert c.completions.create(model="tiny", prompt="a cat", max_tokens=3, seed=0).choices[0].finish_reason in ("stop", "length")


def test_unknown_model_gets_404(lm_server):
    with pytest.raises(openai.NotFoundError) as info:
        client(lm_server).completions.create(model="gpt-9", prompt="a", max_tokens=2)
    assert "gpt-9" in info.value.body["message"] and "tiny" in info.value.body["message"]


def test_models_lists_the_served_model(lm_server):
    models = client(lm_server).models.list()
    assert [m.id for m in models.data] == ["tiny"]
