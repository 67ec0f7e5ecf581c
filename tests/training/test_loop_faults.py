"""The training loop under the faults of docs/reliability.md: interrupted saves, resuming older checkpoints."""

from __future__ import annotations

import dataclasses
import re
import shutil
from pathlib import Path

import pytest
from loop_fixtures import lm_config

from aiayn.checkpoint.state import CorruptCheckpointWarning, list_checkpoints, verify_checkpoint
from aiayn.training.loop import train

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


# --------------------------------------------------------------------------- data-parallel faults (2 gloo processes)


@pytest.mark.slow
def test_a_non_finite_loss_on_one_rank_stops_both_and_names_the_rank(tmp_path):
    from loop_fixtures import save_config, translation_config
    from test_loop import ROOT, torchrun

    path = save_config(translation_config(tmp_path, steps=6, dropout=0.0), tmp_path / "c.yaml")
    out = torchrun(str(ROOT / "tests" / "training" / "ddp_nonfinite_worker.py"), str(path), timeout=180)
    assert out.returncode != 0
    said = out.stderr + out.stdout
    assert "at step 2 (non-finite loss on rank 1 of 2); stopped before the optimizer step" in said
    assert said.count("FloatingPointError") >= 2  # both ranks stopped on the same decision, neither hung


def test_a_different_world_size_is_refused_naming_the_checkpoint_and_the_remedy(tmp_path):
    from aiayn.checkpoint.state import RankState, load_checkpoint
    from aiayn.training.loop import _check_world_size

    config = lm_config(tmp_path, steps=2, save_every=2)
    single = load_checkpoint(train(config).last_checkpoint)
    _check_world_size(single, 1)
    with pytest.raises(ValueError, match=rf"cannot resume {single.path} with 2 process\(es\): it was saved by 1 data-parallel rank.*"
                                         r"--nproc_per_node=1` \(or without torchrun\), or start a new run from its weights with train.init_from="):
        _check_world_size(single, 2)
    two = dataclasses.replace(single, ranks={1: RankState(single.rng, single.trainer.data)})  # as a 2-rank run saves it
    with pytest.raises(ValueError, match=r"with 1 process\(es\): it was saved by 2 data-parallel rank.*--nproc_per_node=2`"):
        _check_world_size(two, 1)
    _check_world_size(two, 2)


@pytest.mark.slow
def test_torchrun_max_restarts_resumes_after_a_rank_dies_and_matches_an_uninterrupted_run(tmp_path):
    """2 ranks with dropout for 8 steps == the same run whose rank 1 dies at step 6, restarted by torchrun: bit for bit.

    Each rank draws its own dropout masks; the checkpoint keeps every rank's generators and loader position
    (``rank-1.*``), so that the restarted rank 1 continues its own from the step-4 checkpoint."""
    import torch
    from loop_fixtures import save_config, translation_config
    from test_loop import ROOT, torchrun

    from aiayn.checkpoint.weights import read_safetensors
    from aiayn.training.metrics_log import read_metrics

    straight = save_config(translation_config(tmp_path / "a", steps=8, dropout=0.3, save_every=2), tmp_path / "a.yaml")
    assert (out := torchrun("-m", "aiayn", "train", str(straight))).returncode == 0, out.stderr[-3000:]
    dying = save_config(translation_config(tmp_path / "b", steps=8, dropout=0.3, save_every=2), tmp_path / "b.yaml")
    out = torchrun("--max-restarts=1", str(ROOT / "tests" / "training" / "ddp_dying_worker.py"), str(dying), timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    said = out.stderr + out.stdout
    assert "failed (exitcode: 17) local_rank: 1" in said  # rank 1 did die
    assert re.search(r"resumed from .*step-00000[24] at step [24]", said)  # continued from a checkpoint, not from scratch
    assert (tmp_path / "b" / "run" / "step-000004" / "rank-1.json").is_file()

    def losses(run):
        return {r["step"]: r["loss"] for r in read_metrics(run) if "loss" in r}

    assert losses(tmp_path / "a" / "run") == losses(tmp_path / "b" / "run")
    a, _ = read_safetensors(tmp_path / "a" / "run" / "step-000008" / "model.safetensors")
    b, _ = read_safetensors(tmp_path / "b" / "run" / "step-000008" / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_target_vocabulary_smaller_than_its_tokenizer_is_caught_before_building(tmp_path, monkeypatch):
    from loop_fixtures import translation_config

    config = translation_config(tmp_path, steps=2)
    config = dataclasses.replace(
        config, model=config.model.replace(tgt_vocab_size=9, share_embeddings=False),
        data=dataclasses.replace(config.data, shared_vocab=False),
    )
    built = []
    monkeypatch.setattr("aiayn.training.loop.model_class", lambda c: built.append(c) or (_ for _ in ()).throw(AssertionError("built")))
    with pytest.raises(ValueError, match=r"the tokenizer has \d+ ids .* but the model's model.tgt_vocab_size is 9"):
        train(config)
    assert built == []  # refused before any model was built, not at the first forward pass
