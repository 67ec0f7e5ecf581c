"""aiayn explain: a forward-pass trace whose totals are the model's real counts."""

import json

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from aiayn import build_model, preset
from aiayn.cli.main import main
from aiayn.viz.explain import explain_config, format_table, trace_model

TINY = ("tiny-encoder-decoder", "tiny-decoder-only", "tiny-encoder-only")


@pytest.mark.parametrize("name", TINY)
@pytest.mark.parametrize("depth", [1, 3, 4])
def test_rows_add_up_to_the_real_totals(name, depth):
    config = preset(name)
    trace = explain_config(config, batch=2, src_len=5, tgt_len=4, depth=depth)
    model = build_model(config)
    assert trace.total_params == trace.model_params == sum(p.numel() for p in model.parameters())
    assert sum(s.params for s in trace.stages) == trace.total_params
    assert sum(s.flops for s in trace.stages) == trace.total_flops
    assert sum(s.activation_bytes for s in trace.stages) == trace.total_activation_bytes
    assert all(s.depth <= depth for s in trace.stages)


def test_flops_match_flop_counter_and_the_formula():
    config = preset("tiny-encoder-decoder", attention_backend="math")
    torch.manual_seed(0)
    model = build_model(config)
    src, tgt = torch.randint(7, 64, (2, 5)), torch.randint(7, 64, (2, 4))
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(src, tgt)
    trace = trace_model(model, {"src": src, "tgt": tgt}, depth=4)
    assert trace.total_flops == counter.get_total_flops()
    stage = {s.name: s for s in trace.stages}
    d, d_ff, v = 32, 64, 64
    assert stage["encoder.layers.0.self_attn.w_o"].flops == 2 * 2 * 5 * d * d  # 2 * B * S * in * out
    # self-attention projects q, k and v in one fused matmul, counted in its own ops with QK^T and AV
    assert stage["encoder.layers.0.self_attn (own ops)"].flops == 2 * 2 * 5 * d * 3 * d + 2 * 2 * 2 * 5 * 5 * d
    assert stage["decoder.layers.1.ffn.w_1"].flops == 2 * 2 * 4 * d * d_ff
    assert stage["output"].flops == 2 * 2 * 4 * d * v
    # attention's own matmuls: QK^T and AV, 2 * B * H * T * S * Dh each = 2 * 2 * B * T * S * d in all
    assert stage["decoder.layers.0.cross_attn (own ops)"].flops == 2 * 2 * 2 * 4 * 5 * d
    assert "encoder.layers.0.self_attn" not in stage  # at depth 4 it is split into its projections and own ops
    assert stage["decoder.layers.0.cross_attn.w_k"].input_shapes == [[2, 5, d]]  # keys from the encoder output


def test_shapes_and_shared_embeddings():
    trace = explain_config(preset("tiny-encoder-decoder"), batch=3, src_len=6, tgt_len=5, depth=3)
    stage = {s.name: s for s in trace.stages}
    assert stage["src_embed"].input_shapes == [[3, 6]] and stage["src_embed"].output_shapes == [[3, 6, 32]]
    assert stage["tgt_embed"].params == 0 and "src_embed" in stage["tgt_embed"].note  # one shared table
    assert stage["output"].output_shapes == [[3, 5, 64]] and "src_embed" in stage["output"].note
    assert stage["decoder.layers.0.cross_attn"].input_shapes == [[3, 5, 32], [3, 6, 32]]
    assert stage["encoder.layers.0.self_attn"].activation_bytes > 0
    text = format_table(trace)
    assert "equals the model's count" in text and f"{trace.total_params:,}" in text


def test_cli_paper_base_table(capsys):
    argv = ["explain", "--preset", "paper-base", "--vocab-size", "37000", "--batch", "2", "--src-len", "10", "--tgt-len", "9", "--depth", "2"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    real = sum(p.numel() for p in build_model("paper-base", vocab_size=37000).parameters())
    assert f"parameters: {real:,} (equals the model's count, {real:,})" in out
    assert "  encoder.layers.5  " in out and "(2, 9, 37000)" in out  # one row per layer at depth 2; the logits


def test_cli_json_file(tmp_path):
    argv = ["explain", "--preset", "tiny-encoder-decoder", "--batch", "2", "--src-len", "10", "--tgt-len", "9"]
    assert main([*argv, "--format", "json", "--out", str(tmp_path / "t.json")]) == 0
    data = json.loads((tmp_path / "t.json").read_text())
    assert data["total_params"] == data["model_params"] == sum(p.numel() for p in build_model("tiny-encoder-decoder").parameters())
    assert data["inputs"] == {"src": [2, 10], "tgt": [2, 9]}
    assert [s["name"] for s in data["stages"]][:3] == ["src_embed", "src_positions", "dropout"]


def test_cli_config_file_and_overrides(tmp_path, capsys):
    config_file = tmp_path / "c.json"
    config_file.write_text(preset("tiny-decoder-only").to_json())
    assert main(["explain", "--config", str(config_file), "--set", "n_layers=3", "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["config"]["n_layers"] == 3
    assert data["total_params"] == sum(p.numel() for p in build_model(preset("tiny-decoder-only", n_layers=3)).parameters())
    with pytest.raises(SystemExit, match="unknown key 'n_layer' for DecoderOnlyConfig"):
        main(["explain", "--config", str(config_file), "--set", "n_layer=3"])
    with pytest.raises(SystemExit, match="batch must be >= 1, got 0"):
        main(["explain", "--preset", "tiny-encoder-only", "--batch", "0"])
