"""benchmarks/llama_peer.py: the tokenizer llama.cpp's converter is given, and the llama.cpp column skipped
with the way to build it when llama-bench is absent."""

import pytest
from bench_scripts import load_benchmark


def test_byte_level_bpe_has_exactly_the_vocabulary_size_and_round_trips():
    peer = load_benchmark("llama_peer")
    tok = peer.byte_level_bpe(700)
    assert tok.get_vocab_size() == 700
    assert tok.token_to_id("<|endoftext|>") == 699  # GPT-2's end of text is its last id
    text = "ROMEO: wherefore art thou? Ünïcödé 字"
    assert tok.decode(tok.encode(text).ids) == text


def test_without_llama_bench_the_column_says_how_to_build(monkeypatch):
    pytest.importorskip("transformers")
    gen = load_benchmark("generation")
    monkeypatch.setattr(gen.llama_peer, "find_llama_bench", lambda explicit=None: None)
    args = gen.parse_args(["--quick"])
    text = gen.bench_llama_cpp(args, gen.QUICK_GPT, [])
    assert "skipped" in text and "benchmarks/llama_cpp.sh build" in text
