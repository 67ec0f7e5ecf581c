"""benchmarks/speculative.py runs (a tiny random model): plain, prompt-lookup and perfect-drafts rows, the drafted
rows with plain greedy's tokens in fp32, drafts known to be right all accepted in fewer forwards than tokens; the
weights' dtype is taken."""

from bench_scripts import load_benchmark


def test_the_rows_and_the_same_tokens(capsys):
    bench = load_benchmark("speculative")
    rows = bench.main(["--quick", "--threads", "1"])
    assert [row.name for row in rows] == ["plain", "prompt-lookup", "perfect-drafts"]
    assert all(row.tokens == rows[0].tokens for row in rows) and len(rows[0].tokens) == 16
    assert rows[2].acceptance == 1.0 and rows[2].forwards < 16
    rows = bench.main(["--quick", "--threads", "1", "--dtype", "bfloat16"])
    assert "bfloat16 weights" in capsys.readouterr().out and len(rows[0].tokens) == 16
