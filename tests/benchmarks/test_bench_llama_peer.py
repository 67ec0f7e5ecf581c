"""benchmarks/llama_peer.py: the tokenizer llama.cpp's converter is given, and the llama.cpp column skipped
with the way to build it when llama-bench is absent."""

from pathlib import Path

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
    assert gen.llama_runners(args, None, 1) == {}  # no llama-bench: nothing joins the rounds
    text = gen.llama_table(args, [])
    assert "skipped" in text and "benchmarks/llama_cpp.sh build" in text


def test_llama_bench_runs_in_the_rounds_of_ours_and_the_table_divides_the_rates(monkeypatch, capsys):
    pytest.importorskip("transformers")
    gen = load_benchmark("generation")
    rates = {"f32": [20.0], "bf16": [40.0], "q8_0": [50.0], "q4_0": [60.0]}
    calls: list[str] = []

    def fake_bench(bench, gguf, threads, prompt, new_tokens, repetitions):
        assert repetitions == 1  # one llama-bench run a round
        calls.append(gguf.name)
        return rates[gguf.name].pop(0)

    monkeypatch.setattr(gen.llama_peer, "find_llama_bench", lambda explicit=None: Path("llama-bench"))
    monkeypatch.setattr(gen.llama_peer, "gguf_files", lambda peer: {fmt: Path(fmt) for fmt in gen.llama_peer.FORMATS})
    monkeypatch.setattr(gen.llama_peer, "llama_bench_tokens_per_s", fake_bench)
    prompt_rates = {"f32": [200.0], "bf16": [400.0], "q8_0": [500.0], "q4_0": [600.0]}

    def fake_prompt_bench(bench, gguf, threads, prompt, repetitions):
        assert repetitions == 1 and prompt == 16  # the benchmark's prompt, into an empty cache
        return prompt_rates[gguf.name].pop(0)

    monkeypatch.setattr(gen.llama_peer, "llama_bench_prompt_tokens_per_s", fake_prompt_bench)
    timed = gen.interleaved

    def prefill_half_the_call(calls, rounds):  # one round of a tiny model: a loaded machine could time its prefill longer
        times = timed(calls, rounds)
        return {name: [t / 2 for t in times[name.removesuffix(":prefill")]] if name.endswith(":prefill") else t
                for name, t in times.items()}

    monkeypatch.setattr(gen, "interleaved", prefill_half_the_call)
    rows, _ = gen.main(["--quick", "--variants", "ours-fp32,hf-fp32", "--batches", "1", "--threads", "1",
                        "--beam", "no"])
    assert sorted(calls) == sorted(rates)  # each format once a round (--quick: one round)
    peer = {r.variant: r for r in rows}
    assert peer["llama.cpp-f32"].tokens_per_s == 20.0
    assert peer["hf-fp32"].decode_tokens_per_s is None  # ours only: our prefill timed apart, in the same rounds
    decode = peer["ours-fp32"].decode_tokens_per_s  # generation alone, as llama-bench's -n after -d times it
    assert decode is not None and decode > 0 and decode != peer["ours-fp32"].tokens_per_s
    out = capsys.readouterr().out
    (round_rate,) = peer["ours-fp32"].decode_rates  # one round: its call less its prefill, paired with llama.cpp's round
    assert round_rate is not None and round_rate == pytest.approx(decode)
    paired = round_rate / 20.0
    assert (f"| 1 | f32 | 20.00 | ours-fp32 | {decode:,.2f} | {decode / 20.0:.2f} | {paired:.2f} ({paired:.2f}-{paired:.2f}) | "
            f">= 1.0: {'met' if paired >= 1.0 else 'missed'}") in out
    assert f"{int(paired >= 1.0)} of 1 rounds |" in out
    assert "ours tok/s (decode only)" in out
    assert not any(prompt_rates.values())  # the prompt processing of each format ran once a round too
    prefill = peer["ours-fp32"].prefill_tokens_per_s  # the prompt's 16 tokens over our median prefill
    assert prefill is not None and prefill > 0 and peer["llama.cpp-f32:prompt"].tokens_per_s == 200.0
    assert f"| 1 | f32 | 200.0 | ours-fp32 | {prefill:,.1f} | {prefill / 200.0:.2f} |" in out
    assert "| llama.cpp-f32:prompt |" not in out  # not a row of the generation table


def test_each_llama_format_runs_beside_our_variants_of_it():
    gen = load_benchmark("generation")
    calls = dict.fromkeys(("ours-fp32", "ours-int8", "hf-fp32", "ours-int8-kvfp32", "ours-fp32:prefill", "ours-int8:prefill",
                           "llama.cpp-f32", "llama.cpp-f32:prompt", "llama.cpp-q8_0", "llama.cpp-q8_0:prompt"))
    assert list(gen.beside_their_format(calls)) == [
        "ours-fp32", "ours-fp32:prefill", "llama.cpp-f32", "llama.cpp-f32:prompt",
        "ours-int8", "ours-int8-kvfp32", "ours-int8:prefill", "llama.cpp-q8_0", "llama.cpp-q8_0:prompt", "hf-fp32"]
