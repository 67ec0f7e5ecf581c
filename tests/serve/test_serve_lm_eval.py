"""lm-evaluation-harness as a real client: ``lm_eval``'s ``local-completions`` model against a server on
127.0.0.1 (its remote tokenizer reads ``/tokenize``), on a rolling-perplexity task defined from a local
file. Its perplexity must equal ``aiayn evaluate``'s (:func:`~aiayn.evaluation.metrics.evaluate_lm`) on
the same text within 1e-3 relative. Skips when the ``lm-eval`` package is absent (``pip install lm-eval``).

The windows line up by construction: lm-eval keeps one of ``max_length`` positions for the generated token
and sends prompts of ``max_length - 1`` tokens: disjoint windows of ``max_length - 2`` scored tokens, each
after the token before it, from a prefix token. With ``max_length`` = the context + 1, the text's first
character as the prefix and ``block_size`` = the context - 1, it scores exactly the tokens ``evaluate_lm``
does, and for character-level ASCII text its byte perplexity is the token perplexity."""

from __future__ import annotations

import json

import pytest
from servers import TEXTS

from aiayn.evaluation.metrics import evaluate_lm

pytest.importorskip("lm_eval", reason="needs lm-evaluation-harness (pip install lm-eval)")


def test_rolling_perplexity_through_lm_eval_equals_aiayn_evaluate(serve, lm_model, tmp_path, monkeypatch):
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    context = lm_model.config.max_len  # 64
    block = context - 1
    words = " ".join(TEXTS).split()
    text = " ".join(words[(i + 1) % len(words)] for i in range(200))[: 3 * block + 1]  # 3 windows and the first character
    assert not (text[1].isspace() or text[-1].isspace())  # lm-eval strips the document's ends
    assert len(lm_model.src_tokenizer.encode(text)) == len(text) == 3 * block + 1
    (tmp_path / "doc.jsonl").write_text(json.dumps({"text": text[1:]}) + "\n", encoding="utf-8")
    (tmp_path / "rolling.yaml").write_text(f"""
task: aiayn_rolling
dataset_path: json
dataset_kwargs:
  data_files:
    test: {tmp_path / "doc.jsonl"}
test_split: test
output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{{{text}}}}"
metric_list:
  - metric: byte_perplexity
""", encoding="utf-8")

    server = serve(lm_model)
    first = lm_model.src_tokenizer.encode(text[0])[0]
    results = simple_evaluate(
        model="local-completions",
        model_args={"base_url": server.url + "/v1/completions", "model": "tiny", "tokenizer_backend": "remote",
                    "max_length": context + 1, "custom_prefix_token_id": first, "num_concurrent": 1, "max_retries": 1},
        tasks=["aiayn_rolling"], task_manager=TaskManager(include_path=str(tmp_path), include_defaults=False),
        log_samples=False, verbosity="ERROR",
    )
    served = results["results"]["aiayn_rolling"]["byte_perplexity,none"]
    expected = evaluate_lm(lm_model.model, lm_model.src_tokenizer, text, block_size=block)
    assert expected["tokens"] == 3 * block
    assert served == pytest.approx(expected["perplexity"], rel=1e-3)
