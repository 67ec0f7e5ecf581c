"""benchmarks/train_throughput.py --quick: both models train on a tiny shape and the table is printed."""

import math
import statistics

import pytest
import torch
from bench_scripts import load_benchmark

pytest.importorskip("transformers")


def _load_script():
    return load_benchmark("train_throughput")


def test_quick_mode_times_both_models_in_both_dtypes(capsys: pytest.CaptureFixture[str]) -> None:
    bench = _load_script()
    threads = torch.get_num_threads()
    rows = bench.main(["--quick"])
    assert torch.get_num_threads() == threads  # restored for the rest of the session
    assert [(r.shape, r.dtype) for r in rows] == [("tiny", "fp32"), ("tiny", "bf16")]
    for r in rows:
        assert r.ours_tokens_per_s > 0 and r.peer_tokens_per_s > 0 and math.isfinite(r.ratio)
        assert r.rounds == 2 and r.steps_per_round == 1
        assert r.ratio == pytest.approx(statistics.median(o / p for o, p in zip(r.ours_rates, r.peer_rates)))  # paired rounds
    out = capsys.readouterr().out
    assert "| tiny | fp32 |" in out and "| tiny | bf16 |" in out
    assert "same-weights loss" in out and "6 N + 12 L d T" in out


def test_flops_formula_and_flag_errors() -> None:
    bench = _load_script()
    shape = bench.QUICK_SHAPE
    ours, peer = bench.build_pair(shape)
    n = sum(p.numel() for p in ours.parameters()) - shape.n_positions * shape.d_model
    assert bench.flops_per_token(ours, shape) == 6 * n + 12 * shape.n_layers * shape.d_model * shape.seq_len
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in peer.parameters())
    with pytest.raises(SystemExit):
        bench.parse_args(["--shapes", "huge"])
    with pytest.raises(SystemExit):
        bench.parse_args(["--rounds", "0"])
    with pytest.raises(SystemExit):
        bench.parse_args(["--dtypes", "fp32,fp8"])
    assert bench.parse_args(["--shapes", "gpt2", "--dtypes", "bf16"]).dtype_list == ["bf16"]


def test_fp32_only_measures_no_bf16_peak(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """--dtypes fp32 never times a bf16 matmul (minutes without native bf16); its bf16 columns say n/a."""
    bench = _load_script()
    measured = []
    real = bench.matmul_peak
    monkeypatch.setattr(bench, "matmul_peak", lambda dtype, n=2048, repeats=5: measured.append(dtype) or real(dtype, n, repeats))
    bench.main(["--quick", "--dtypes", "fp32"])
    assert measured == [torch.float32]
    row = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| tiny | fp32 |")]
    assert len(row) == 1 and row[0].endswith("| n/a | n/a |")


def test_master_weights_rows_and_the_auto_rule_line(capsys: pytest.CaptureFixture[str]) -> None:
    """bf16-master (ours: fp32 masters, bf16 copies; the peer: autocast) is timed beside bf16, the rule's pick is
    checked against the faster one, and --loss own's chunked loss equals the shared one."""
    bench = _load_script()
    logits, targets = torch.randn(2, 5, 65), torch.randint(65, (2, 5))
    torch.testing.assert_close(bench.own_loss(logits, targets), bench.shared_loss(logits, targets))
    rows = bench.main(["--quick", "--dtypes", "bf16,bf16-master", "--loss", "own"])
    assert [r.dtype for r in rows] == ["bf16", "bf16-master"] and all(r.ours_tokens_per_s > 0 for r in rows)
    out = capsys.readouterr().out
    assert "auto rule (0.0 M parameters vs MASTER_MIN_PARAMS 50 M): picks bf16; faster here: " in out
    assert "| tiny | bf16-master |" in out
