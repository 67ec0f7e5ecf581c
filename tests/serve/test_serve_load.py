"""A bounded load test: 16 clients for at most 20 s. Every request is answered once, and each answer is
the one its own seed gives alone (no request lost, duplicated, or mixed with another's row)."""

from __future__ import annotations

import concurrent.futures
import time

import httpx
from serve_helpers import reference_completion

CLIENTS, PER_CLIENT, BUDGET_S = 16, 3, 20.0


def test_sixteen_clients(serve, lm_model):
    server = serve(lm_model, max_batch=8, max_queue=64)
    deadline = time.monotonic() + BUDGET_S

    def client(c: int) -> list[tuple[int, dict]]:
        answers = []
        with httpx.Client(base_url=server.url, timeout=BUDGET_S) as http:
            for j in range(PER_CLIENT):
                if time.monotonic() > deadline:
                    break
                seed = c * 100 + j
                r = http.post("/v1/completions", json={"prompt": ["a cat", "the dog", "hello"][seed % 3], "max_tokens": 8 + seed % 5, "seed": seed})
                assert r.status_code == 200, r.text
                answers.append((seed, r.json()))
        return answers

    start = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(CLIENTS) as pool:
        answers = [a for f in [pool.submit(client, c) for c in range(CLIENTS)] for a in f.result(BUDGET_S + 10)]
    assert time.monotonic() - start <= BUDGET_S + 5
    assert len(answers) == CLIENTS * PER_CLIENT  # none lost (and the budget was enough for all)
    assert len({body["id"] for _, body in answers}) == len(answers)  # none answered twice
    for seed, body in answers:
        prompt, max_tokens = ["a cat", "the dog", "hello"][seed % 3], 8 + seed % 5
        assert body["choices"][0]["text"] == reference_completion(lm_model, prompt, max_tokens, seed)[0], seed
    metrics = httpx.get(server.url + "/metrics").text
    assert f'aiayn_requests_total{{endpoint="/v1/completions",status="200"}} {float(len(answers))}' in metrics
