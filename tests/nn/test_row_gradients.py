"""A tied embedding's gradient passed back as its rows (aiayn.nn.embedding.use_row_gradients): only tied tables take it,
the table's gradient stays dense and equal to the whole-table way's (fp32 and bf16, repeated ids, one or two
backward passes into it), and `aiayn train` of a language model uses it and resumes bit for bit."""

import logging

import pytest
import torch
from loop_fixtures import lm_config

from aiayn import build_model
from aiayn.checkpoint.weights import read_safetensors
from aiayn.nn.embedding import TokenEmbedding, use_row_gradients
from aiayn.training.loop import train
from aiayn.training.metrics_log import read_metrics


def _pair(tie: bool = True):
    torch.manual_seed(0)
    dense = build_model("tiny-decoder-only", d_model=16, d_ff=32, n_heads=2, n_layers=1, vocab_size=24, tie_output=tie)
    rows = build_model("tiny-decoder-only", d_model=16, d_ff=32, n_heads=2, n_layers=1, vocab_size=24, tie_output=tie)
    rows.load_state_dict(dense.state_dict())
    return dense, rows


def test_only_tied_tables_take_it():
    dense, rows = _pair(tie=True)
    assert use_row_gradients(rows) == 1 and rows.embed.row_gradients and not dense.embed.row_gradients
    _, untied = _pair(tie=False)
    assert use_row_gradients(untied) == 0 and not untied.embed.row_gradients


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("passes", [1, 2])
def test_the_tables_gradient_is_dense_and_the_same(dtype, passes):
    dense, rows = _pair()
    use_row_gradients(rows)
    ids = torch.tensor([[1, 5, 5, 7, 1, 1], [3, 5, 0, 23, 23, 2]])  # repeated ids: their rows summed
    for model in (dense, rows):
        model.to(dtype)
        for _ in range(passes):  # a second pass adds into the gradient the first left (micro-batches)
            model(ids).float().square().mean().backward()
    a, b = dense.embed.weight.grad, rows.embed.weight.grad
    assert b.layout == torch.strided and b.dtype == dtype and rows.output.weight.grad is b
    tolerance = {"rtol": 1e-5, "atol": 1e-7} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 1e-3}
    torch.testing.assert_close(b, a, **tolerance)
    assert not torch.equal(b[[1, 5]], torch.zeros_like(b[[1, 5]]))  # the looked-up rows hold their part
    other = dense.decoder.layers[0].ffn.w_1.weight.grad
    torch.testing.assert_close(rows.decoder.layers[0].ffn.w_1.weight.grad, other, **tolerance)


def test_an_lm_run_uses_it_and_resumes_bit_for_bit(tmp_path, caplog, monkeypatch):
    made = []
    original = TokenEmbedding.forward
    monkeypatch.setattr(TokenEmbedding, "forward", lambda self, ids: made.append(self.row_gradients) or original(self, ids))
    with caplog.at_level(logging.INFO, logger="aiayn.training.loop"):
        straight = train(lm_config(tmp_path / "a", steps=4, save_every=2, eval_every=4))
    assert "tied embedding: its lookup's gradient passed back as rows" in caplog.text and made and all(made)
    train(lm_config(tmp_path / "b", steps=4, save_every=2, eval_every=4, stop_after=2))
    resumed = train(lm_config(tmp_path / "b", steps=4, save_every=2, eval_every=4))
    losses = [{r["step"]: r["loss"] for r in read_metrics(run.run_dir) if "loss" in r} for run in (straight, resumed)]
    assert sorted(losses[0]) == [1, 2, 3, 4] and losses[0] == losses[1]
    a, _ = read_safetensors(straight.run_dir / "step-000004" / "model.safetensors")
    b, _ = read_safetensors(resumed.run_dir / "step-000004" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
