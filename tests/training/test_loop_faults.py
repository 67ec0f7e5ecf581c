"""The training loop under the faults of docs/reliability.md: interrupted saves, resuming older checkpoints."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest

from aiayn.checkpoint.state import CorruptCheckpointWarning, list_checkpoints, verify_checkpoint
from aiayn.training.loop import train
from loop_fixtures import lm_config

pytestmark = pytest.mark.reliability


def _longer(config, steps):
    return dataclasses.replace(config, train=dataclasses.replace(config.train, max_steps=steps))


def test_only_interrupted_saves_left_stops_with_a_clear_error(tmp_path):
    config = lm_config(tmp_path, steps=3, save_every=3)
    run = train(config).run_dir
    (run / "step-000003" / "COMPLETE").unlink()  # killed before the marker (a copy made mid-save, say)
    for resume in ("auto", False):
        with pytest.warns(CorruptCheckpointWarning, match="step-000003: an interrupted save"), pytest.raises(
            FileExistsError, match=rf"{run} holds no complete checkpoint, only interrupted saves .*\(step-000003\).*Move or delete them"
        ):
            train(config, resume=resume)


def test_an_interrupted_save_after_a_good_one_is_skipped_and_set_aside(tmp_path):
    config = lm_config(tmp_path, steps=6, save_every=3)
    run = train(config).run_dir
    (run / "step-000006" / "COMPLETE").unlink()
    with pytest.warns(CorruptCheckpointWarning, match="step-000006: an interrupted save"):
        result = train(_longer(config, 9))
    assert result.step == 9
    assert len(list(run.glob("incomplete-step-000006-*"))) == 1


def test_resuming_an_older_checkpoint_never_calls_newer_ones_corrupt(tmp_path):
    config = lm_config(tmp_path, steps=6, save_every=3)
    run = train(config).run_dir
    train(_longer(config, 9), resume=str(run / "step-000003"))
    assert not list(run.glob("corrupt-*"))
    (aside,) = run.glob("superseded-step-000006-*")
    verify_checkpoint(aside)  # still a valid checkpoint, moved out of the way, not deleted
    assert [p.name for p in list_checkpoints(run)][-1] == "step-000009"
    shutil.rmtree(aside)


# --------------------------------------------------------------------------- fp16 with a gradient scaler (CPU)


def _overflow_at(monkeypatch, micro_batches: set[int]):
    """Multiply the loss of the given training micro-batches (1-based) by 1e10: finite in fp32, but the
    scaled gradients overflow fp16, which is the GradScaler's to handle."""
    from aiayn.training.objectives import Objective

    original, calls = Objective.forward, {"n": 0}

    def forward(self, batch):
        loss = original(self, batch)
        if self.training:
            calls["n"] += 1
            if calls["n"] in micro_batches:
                return type(loss)(loss.sum * 1e10, loss.count)
        return loss

    monkeypatch.setattr(Objective, "forward", forward)


def _scaler(run, step):
    import json

    return json.loads((run / f"step-{step:06d}" / "trainer.json").read_text())["scaler"]


def test_fp16_overflow_skips_the_step_and_lowers_the_scale(tmp_path, monkeypatch):
    _overflow_at(monkeypatch, {2})
    config = lm_config(tmp_path, steps=4, save_every=2, precision="fp16", device="cpu")
    result = train(config)  # train.nonfinite=raise (the default) must not fire: the scaler skips the step
    assert result.step == 4
    assert _scaler(result.run_dir, 4)["scale"] == 2.0**15  # halved once from 2**16
    from aiayn.training.metrics_log import read_metrics

    assert sorted(r["step"] for r in read_metrics(result.run_dir) if "loss" in r) == [1, 2, 3, 4]


def test_fp16_resume_restores_the_scaler_and_matches_a_straight_run(tmp_path, monkeypatch):
    import torch

    from aiayn.checkpoint.weights import read_safetensors
    from aiayn.training.metrics_log import read_metrics

    _overflow_at(monkeypatch, {2})
    straight = train(lm_config(tmp_path / "a", steps=6, save_every=3, precision="fp16", device="cpu")).run_dir
    _overflow_at(monkeypatch, {2})
    config = lm_config(tmp_path / "b", steps=6, save_every=3, precision="fp16", device="cpu")
    train(dataclasses.replace(config, train=dataclasses.replace(config.train, stop_after=3)))
    assert _scaler(Path(config.run_dir), 3)["scale"] == 2.0**15
    monkeypatch.undo()
    resumed = train(config).run_dir
    assert _scaler(resumed, 6) == _scaler(straight, 6)  # a fresh scaler would say 2**16 here
    losses = [{r["step"]: r["loss"] for r in read_metrics(run) if "loss" in r} for run in (straight, resumed)]
    assert losses[0] == losses[1]
    a, _ = read_safetensors(straight / "step-000006" / "model.safetensors")
    b, _ = read_safetensors(resumed / "step-000006" / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
