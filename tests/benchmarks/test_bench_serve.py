"""benchmarks/serve.py --quick on a tiny saved model: a server subprocess, the peer in process, every number produced."""

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("fastapi")

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "serve.py"


@pytest.mark.slow
def test_quick_run_measures_everything(tmp_path):
    from aiayn import build_model
    from aiayn.pretrained import save_pretrained
    from aiayn.tokenization import CharTokenizer

    tokenizer = CharTokenizer.train(["ROMEO:\nBut soft, what light through yon window breaks? It is the east"])
    torch.manual_seed(0)
    save_pretrained(tmp_path / "lm", build_model("tiny-decoder-only", vocab_size=tokenizer.vocab_size, max_len=64).eval(), tokenizer)
    spec = importlib.util.spec_from_file_location("bench_serve", SCRIPT)
    bench = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench  # dataclasses look their module up while the script is being executed
    spec.loader.exec_module(bench)
    threads = torch.get_num_threads()
    [result] = bench.main(["--checkpoint", str(tmp_path / "lm"), "--quick", "--out", str(tmp_path / "out.json")])
    assert torch.get_num_threads() == threads
    summary = result.summary()
    assert summary["speedup_8_vs_1"] > 0 and summary["ttft_p50_loaded_ms"] > 0 and summary["server_ms"] > 0
    assert result.tokens_per_request == [8]  # EOS banned: exactly --max-tokens
    assert (tmp_path / "out.json").is_file()
