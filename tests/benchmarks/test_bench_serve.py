"""benchmarks/serve.py --quick on a tiny saved model: a server subprocess, the peer in process, every number produced."""

import pytest
import torch
from bench_scripts import load_benchmark

pytest.importorskip("fastapi")


@pytest.mark.slow
def test_quick_run_measures_everything(tmp_path):
    from aiayn import build_model
    from aiayn.pretrained import save_pretrained
    from aiayn.tokenization import CharTokenizer

    tokenizer = CharTokenizer.train(["ROMEO:\nBut soft, what light through yon window breaks? It is the east"])
    torch.manual_seed(0)
    save_pretrained(tmp_path / "lm", build_model("tiny-decoder-only", vocab_size=tokenizer.vocab_size, max_len=64).eval(), tokenizer)
    bench = load_benchmark("serve")
    threads = torch.get_num_threads()
    [result] = bench.main(["--checkpoint", str(tmp_path / "lm"), "--quick", "--out", str(tmp_path / "out.json")])
    assert torch.get_num_threads() == threads
    summary = result.summary()
    assert summary["speedup_8_vs_1"] > 0 and summary["ttft_p50_loaded_ms"] > 0 and summary["server_ms"] > 0
    assert result.tokens_per_request == [8]  # EOS banned: exactly --max-tokens
    assert (tmp_path / "out.json").is_file()
