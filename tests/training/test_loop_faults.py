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
