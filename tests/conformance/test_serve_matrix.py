"""Every ``aiayn serve`` endpoint, in process, for every model variant of :mod:`variants` (ours and
tiny Hugging Face imports with their real special ids): greedy output equal to ``aiayn.load(...)``'s
token for token, classification and fill-mask equal to Python's, and an endpoint the model cannot
serve refused with a 400 that names why and left out of ``/v1/models``."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import ExitStack

import pytest
import torch

pytest.importorskip("fastapi", reason="needs the serve extra (pip install aiayn[serve])")
from fastapi.testclient import TestClient
from variants import LM_CONTEXT, PROMPT, SOURCE, VARIANTS, names, variant_dir

import aiayn
from aiayn.decoding.adapters import CausalLMDecoder
from aiayn.decoding.generation import STOP_EOS, generate
from aiayn.decoding.text import generation_config, prompt_ids
from aiayn.serve.app import create_app
from aiayn.serve.loading import ServedModel

NEW_TOKENS = LM_CONTEXT + 6  # past the learned context of lm-learned: its window slides


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, tuple[TestClient, aiayn.LoadedModel]]]:
    """A running app and the Python model per variant, started on first use, all stopped at the end."""
    started: dict[str, tuple[TestClient, aiayn.LoadedModel]] = {}
    with ExitStack() as stack:

        class Lazy(dict):
            def __missing__(self, name: str) -> tuple[TestClient, aiayn.LoadedModel]:
                loaded = aiayn.load(variant_dir(name))  # served as it is: one load, the loader of load_served_model
                served = ServedModel(loaded.model, loaded.config, loaded.src_tokenizer, loaded.tgt_tokenizer, "m", loaded.labels)
                client = stack.enter_context(TestClient(create_app(lambda: served, max_batch=4)))
                deadline = time.monotonic() + 60
                while client.get("/health").status_code != 200:
                    assert time.monotonic() < deadline, client.get("/health").text
                    time.sleep(0.02)
                self[name] = (client, loaded)
                return self[name]

        started = Lazy()
        yield started


def _reference_ids(loaded: aiayn.LoadedModel, prompt: str, n: int) -> list[int]:
    """Python's greedy tokens (EOS left out), by the call ``LoadedModel.generate`` makes."""
    tok = loaded.tokenizer
    out = generate(CausalLMDecoder(loaded.model), torch.tensor([prompt_ids(tok, prompt)]), None,
                   generation_config(tok, max_new_tokens=n, greedy=True))
    ids = out.sequences()[0]
    return ids[:-1] if out.stop_reasons[0] == STOP_EOS else ids


@pytest.mark.parametrize("name", names("decoder-only"))
def test_completions_equal_generate(servers, name):
    client, loaded = servers[name]
    body = {"prompt": PROMPT, "max_tokens": NEW_TOKENS, "temperature": 0, "logprobs": 0, "return_tokens_as_token_ids": True}
    r = client.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert PROMPT + choice["text"] == loaded.generate(PROMPT, max_new_tokens=NEW_TOKENS, greedy=True)
    assert [int(t.split(":")[1]) for t in choice["logprobs"]["tokens"]] == _reference_ids(loaded, PROMPT, NEW_TOKENS)
    assert choice["window_slid"] is (name == "lm-learned")
    # echo of BOS + the prompt as token ids scores the prompt as Python's score does
    bos = loaded.special_ids.bos
    ids = [bos, *loaded.tokenizer.encode(PROMPT)] if bos is not None else loaded.tokenizer.encode(PROMPT)
    r = client.post("/v1/completions", json={"prompt": ids, "max_tokens": 0, "echo": True, "logprobs": 1})
    assert r.status_code == 200, r.text
    scores = r.json()["choices"][0]["logprobs"]["token_logprobs"]
    assert scores[0] is None and sum(scores[1:]) == pytest.approx(loaded.score(PROMPT)[0], abs=1e-4)


@pytest.mark.parametrize("name", names("encoder-decoder"))
def test_translations_equal_translate(servers, name):
    client, loaded = servers[name]
    for beam in (1, 2):
        r = client.post("/v1/translations", json={"text": SOURCE, "beam_size": beam, "max_tokens": 12})
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"] == loaded.translate(SOURCE, beam_size=beam, max_new_tokens=12)[0], beam
    r = client.post("/v1/translations", json={"text": SOURCE, "echo": True})
    assert r.status_code == 400 and r.json()["error"]["param"] == "echo"


@pytest.mark.parametrize("name", names("encoder-only"))
def test_encoder_endpoints_equal_python(servers, name):
    client, loaded = servers[name]
    offered = client.get("/v1/models").json()["data"][0]["endpoints"]
    text = "the cat sat"
    r = client.post("/v1/classifications", json={"input": [text]})
    if loaded.config.n_classes:
        assert "/v1/classifications" in offered and r.status_code == 200, r.text
        got, expected = r.json()["data"][0], loaded.classify([text])[0]
        assert got["label"] == expected.label and got["probs"] == pytest.approx(expected.probs, abs=1e-6)
        if VARIANTS[name].hf is None or name == "hf-bert-classifier":
            assert got["label"] in ("negative", "positive")  # by name, as in Python
    else:
        assert "/v1/classifications" not in offered and r.status_code == 400 and "classification head" in r.json()["error"]["message"]
    mask = loaded.tokenizer.id_to_token(loaded.special_ids.mask)
    masked = f"the {mask} sat"
    r = client.post("/v1/fill-mask", json={"input": masked, "top_k": 3})
    if loaded.config.mlm_head:
        assert "/v1/fill-mask" in offered and r.status_code == 200, r.text
        got = r.json()["data"][0]["masks"][0]["candidates"]
        expected = loaded.fill_mask(masked, top_k=3).candidates[0]
        assert [c["token"].strip() for c in got] == [t for t, _ in expected]
        assert [c["prob"] for c in got] == pytest.approx([p for _, p in expected], abs=1e-6)
    else:
        assert "/v1/fill-mask" not in offered and r.status_code == 400 and "masked-LM head" in r.json()["error"]["message"]


@pytest.mark.parametrize("name", ["lm-learned", "hf-gpt2", "hf-bert", "hf-marian"])
def test_models_and_tokenize_report_the_tokenizer(servers, name):
    client, loaded = servers[name]
    card = client.get("/v1/models").json()["data"][0]
    specials = {role: entry["id"] for role, entry in card["tokenizer"]["special_tokens"].items()}
    assert specials == {role: i for role, i in loaded.special_ids.to_dict().items() if i is not None}
    assert card["context_length"] == loaded.config.max_len
    text = "the cat"
    r = client.post("/tokenize", json={"prompt": text, "add_special_tokens": False}).json()
    assert r["tokens"] == loaded.tokenizer.encode(text) and r["count"] == len(r["tokens"])
    assert client.post("/detokenize", json={"tokens": r["tokens"]}).json()["prompt"] == loaded.tokenizer.decode(r["tokens"])
    eos = loaded.special_ids.eos
    if eos is not None:  # a special token's spelling is its id, as in vLLM (what lm-eval's remote tokenizer relies on)
        spelled = client.get("/tokenizer_info").json()["eos_token"]
        assert client.post("/tokenize", json={"prompt": spelled, "add_special_tokens": False}).json()["tokens"] == [eos]
