"""The catalogue items that held when tried by hand but had no test: each gets one here."""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from loop_fixtures import lm_config, save_config, translation_config
from training_helpers import assert_same

from aiayn.checkpoint.state import load_checkpoint
from aiayn.nn.attention import scaled_dot_product_attention as attend
from aiayn.training.loop import _rank_state, _restore_scaler, train
from aiayn.training.metrics_log import read_metrics
from aiayn.training.objectives import Objective

pytestmark = pytest.mark.reliability
ROOT = Path(__file__).resolve().parents[2]


def _loop(config, **changes):
    return dataclasses.replace(config, train=dataclasses.replace(config.train, **changes))


def _losses(run_dir) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(run_dir) if "loss" in r}


def test_a_save_inside_a_gradient_accumulation_window_resumes_bit_for_bit(tmp_path):
    """With train.accumulate=3 a checkpoint is written between optimizer steps, never inside a window: the
    loader position counts micro-batches, so a resume takes the next window's first micro-batch."""
    straight = train(lm_config(tmp_path / "a", steps=4, save_every=2, accumulate=3))
    config = lm_config(tmp_path / "b", steps=4, save_every=2, accumulate=3)
    train(_loop(config, stop_after=2))
    resumed = train(config)
    assert _losses(tmp_path / "a" / "run") == _losses(tmp_path / "b" / "run")
    a, b = load_checkpoint(straight.last_checkpoint), load_checkpoint(resumed.last_checkpoint)
    assert a.trainer.data == b.trainer.data  # the same micro-batch position
    assert_same(a.model_state, b.model_state, "weights")
    assert_same(a.optimizer_state, b.optimizer_state, "optimizer")


def test_a_missing_fp16_scaler_on_resume_is_a_warning_naming_the_checkpoint(tmp_path, caplog):
    """Documented as a warning, not an error: a fresh scale is safe (the first steps may overflow and be
    skipped while it comes down); the weights and optimizer are exact."""
    checkpoint = load_checkpoint(train(lm_config(tmp_path, steps=1, save_every=1)).last_checkpoint)
    without = dataclasses.replace(checkpoint, trainer=dataclasses.replace(checkpoint.trainer, scaler=None))
    scaler = torch.amp.GradScaler("cpu", enabled=True)
    with caplog.at_level(logging.WARNING, logger="aiayn.training.loop"):
        _restore_scaler(scaler, without)
    assert f"{checkpoint.path} holds no fp16 gradient-scaler state: starting from a fresh scale" in caplog.text
    assert scaler.get_scale() == torch.amp.GradScaler("cpu").get_scale()


def test_a_missing_per_rank_rng_is_an_error_naming_the_checkpoint_and_the_remedy(tmp_path):
    """An error, not the catalogue's warning: rank 1 continuing with fresh generators would draw other
    dropout masks than an uninterrupted run, silently."""
    checkpoint = load_checkpoint(train(lm_config(tmp_path, steps=1, save_every=1)).last_checkpoint)
    with pytest.raises(ValueError, match=rf"{checkpoint.path} was saved by 1 data-parallel rank\(s\) and holds no state "
                                         r"for rank 1: resume it with --nproc_per_node=1"):
        _rank_state(checkpoint, 1, 2)


def test_a_loss_times_1e30_stops_before_the_optimizer_step_naming_the_step(tmp_path, monkeypatch):
    """A finite but huge loss: fp32 gradients of 1e30 square past float32's range, so the global norm is
    inf; the step is refused (train.nonfinite=raise), no weight moves."""
    original = Objective.forward

    def huge(self, batch):
        loss = original(self, batch)
        return type(loss)(loss.sum * 1e30, loss.count)

    monkeypatch.setattr(Objective, "forward", huge)
    with pytest.raises(FloatingPointError, match=r"non-finite loss \(.*\) or gradient norm \(inf\) at step 1; stopped before the optimizer step"):
        train(lm_config(tmp_path, steps=2))


def _reference(q, k, v, mask):
    scores = (q.double() @ k.double().transpose(-1, -2)) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    return weights @ v.double(), weights


def test_fully_masked_rows_on_the_need_weights_path_give_zero_weights_and_outputs():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 2, 5, 4) for _ in range(3))
    mask = torch.ones(2, 1, 5, 5, dtype=torch.bool)
    mask[0, :, 3] = False  # one query with nothing to attend to
    mask[1] = False  # a whole row of the batch
    out, weights = attend(q, k, v, mask=mask, backend="math", return_weights=True)
    assert weights is not None and torch.isfinite(out).all() and torch.isfinite(weights).all()
    assert (weights[0, :, 3] == 0).all() and (weights[1] == 0).all() and (out[1] == 0).all()
    ref_out, ref_weights = _reference(q, k, v, mask.expand(2, 2, 5, 5))
    torch.testing.assert_close(weights.double(), ref_weights, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(out.double(), ref_out, atol=1e-6, rtol=1e-6)
    sums = weights.sum(-1)
    torch.testing.assert_close(sums[0, :, [0, 1, 2, 4]], torch.ones(2, 4))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("backend", ["math", "sdpa"])
def test_half_precision_causal_attention_with_padding_matches_float64(dtype, backend):
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 2, 6, 8).to(dtype) for _ in range(3))
    keep = torch.tensor([[True] * 6, [True] * 3 + [False] * 3])  # the second sequence is padded after 3
    mask = keep[:, None, None, :] & torch.ones(6, 6, dtype=torch.bool).tril()
    out, _ = attend(q, k, v, mask=keep[:, None, None, :].expand(2, 1, 6, 6), causal=True, backend=backend)
    assert out.dtype == dtype and torch.isfinite(out).all()
    ref, _ = _reference(q, k, v, mask)
    torch.testing.assert_close(out.double(), ref, atol=2e-2, rtol=2e-2)


@pytest.mark.slow
def test_nonfinite_skip_across_two_gloo_ranks_drops_the_step_on_both(tmp_path):
    """Rank 1 alone gets an infinite loss at its second micro-batch: with train.nonfinite=skip both ranks
    drop that step on the same decision, name the rank, and the run completes its steps."""
    config = _loop(translation_config(tmp_path, steps=3, dropout=0.0, save_every=3, eval_every=3), nonfinite="skip")
    path = save_config(config, tmp_path / "c.yaml")
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'tests' / 'training'}", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           str(ROOT / "tests" / "training" / "ddp_nonfinite_worker.py"), str(path)]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=180)
    said = out.stdout + out.stderr
    assert out.returncode == 0, said[-3000:]
    assert said.count("at step 2 (non-finite loss on rank 1 of 2): step skipped (1 in a row)") == 2  # both ranks
    assert load_checkpoint(Path(config.run_dir) / "step-000003").step == 3
