"""benchmarks/speculative.py runs (a tiny random model): plain, prompt-lookup and perfect-drafts rows, the drafted
rows with plain greedy's tokens in fp32, drafts known to be right all accepted in fewer forwards than tokens, each
run's time split into the prefill, the forwards and the rest; the weights' dtype is taken."""

from bench_scripts import load_benchmark


def test_the_rows_and_the_same_tokens(capsys):
    bench = load_benchmark("speculative")
    rows = bench.main(["--quick", "--threads", "1"])
    assert [row.name for row in rows] == ["plain", "prompt-lookup", "perfect-drafts"]
    assert all(row.tokens == rows[0].tokens for row in rows) and len(rows[0].tokens) == 16
    assert rows[2].acceptance == 1.0 and rows[2].forwards < 16
    for row in rows:  # the split of each run's time: a prefill and forwards inside it
        assert len(row.prefill_s) == len(row.forward_s) == len(row.seconds) == 1
        assert 0 < row.prefill_s[0] and 0 < row.forward_s[0] and row.prefill_s[0] + row.forward_s[0] < row.seconds[0]
    assert "| ms: prefill | forwards | the rest |" in capsys.readouterr().out
    rows = bench.main(["--quick", "--threads", "1", "--dtype", "bfloat16"])
    assert "bfloat16 weights" in capsys.readouterr().out and len(rows[0].tokens) == 16


def test_vs_plain_is_read_round_by_round(capsys):
    """Each run of a row is timed beside plain decoding's of the same round: the speedup is the median of those
    ratios, so rounds of a faster and a slower host state do not mix (the ratio of the medians here would be 0.67x)."""
    import argparse

    bench = load_benchmark("speculative")
    plain = bench.Row("plain", [1.0, 1.0, 3.0], [1] * 8, prefill_s=[0.1] * 3, forward_s=[0.5] * 3)
    drafted = bench.Row("prompt-lookup", [0.5, 2.0, 1.5], [1] * 8, 0.9, 3, prefill_s=[0.1] * 3, forward_s=[0.2] * 3)
    args = argparse.Namespace(quantize=None, dtype=None, threads=1, prompt_repeats=2, new_tokens=8, draft_tokens=7, ngram=3)
    bench.report([plain, drafted], args, 16)
    out = capsys.readouterr().out
    assert "| prompt-lookup | 5.3 | 2.00x | yes | 0.90 |" in out  # rounds 2.0, 0.5, 2.0: median 2.0
