"""benchmarks/copy_text.py: chunks of whole lines from the first 90% of a text, each repeated 2-8 times in a row,
none from the held-out tail; a text without such chunks is refused naming the argument."""

import pytest
from bench_scripts import load_benchmark


def test_chunks_of_whole_lines_repeated_and_the_tail_held_out(tmp_path):
    bench = load_benchmark("copy_text")
    lines = [f"line {i:03d} of the play, spoken aloud\n" for i in range(100)]  # 33 characters each: one chunk each
    text = "".join(lines)
    out = bench.copy_text(text)
    counts = {line: out.count(line) for line in lines}
    assert all(2 <= counts[line] <= 8 for line in lines[:89]) and len({counts[line] for line in lines[:89]}) > 1
    assert not any(counts[line] for line in lines[90:])  # the last tenth: unseen, for prompts
    assert out.startswith(lines[0] * counts[lines[0]])  # a chunk's copies in a row
    assert bench.copy_text(text) == out  # the same seed, the same text
    source = tmp_path / "short.txt"
    source.write_text("a\nb\n")
    with pytest.raises(SystemExit):
        bench.main([str(source), str(tmp_path / "out.txt")])
