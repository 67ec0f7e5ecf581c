"""checkpoint.directory under faults: interrupted saves, marker entries outside the folder, symlinks, newer checkpoints."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest
from training_helpers import TinyModel

from aiayn.checkpoint.directory import incomplete_checkpoints, set_aside_newer
from aiayn.checkpoint.retention import RetentionConfig, rotate_checkpoints
from aiayn.checkpoint.state import (
    CorruptCheckpointError,
    CorruptCheckpointWarning,
    latest_checkpoint,
    list_checkpoints,
    save_checkpoint,
    verify_checkpoint,
)

pytestmark = pytest.mark.reliability


def _save(run: Path, step: int) -> Path:
    return save_checkpoint(run, step=step, model=TinyModel(), config={}, save_rng=False)


def _rewrite_marker(checkpoint: Path, name: str) -> None:
    """List ``name`` in the marker in place of trainer.json (same size and hash entry)."""
    marker = json.loads((checkpoint / "COMPLETE").read_text())
    marker["files"][name] = marker["files"].pop("trainer.json")
    (checkpoint / "COMPLETE").write_text(json.dumps(marker))


@pytest.mark.parametrize("name", ["../secret.json", "/etc/hostname", "sub/../trainer.json", "..", ""])
def test_marker_entries_outside_the_checkpoint_are_refused(tmp_path: Path, name: str) -> None:
    checkpoint = _save(tmp_path, 1)
    (tmp_path / "secret.json").write_text("{}")
    _rewrite_marker(checkpoint, name)
    with pytest.raises(CorruptCheckpointError, match=rf"{checkpoint}/COMPLETE: lists '{name}', which is not a file name inside"):
        verify_checkpoint(checkpoint)


def test_a_file_symlinked_out_of_the_checkpoint_is_refused(tmp_path: Path) -> None:
    checkpoint = _save(tmp_path, 1)
    outside = tmp_path / "elsewhere.json"
    os.replace(checkpoint / "trainer.json", outside)
    os.symlink(outside, checkpoint / "trainer.json")
    with pytest.raises(CorruptCheckpointError, match=r"trainer.json: is a symbolic link"):
        verify_checkpoint(checkpoint)


def test_a_symlinked_step_directory_is_ignored_with_a_warning_and_rotation_survives(tmp_path: Path) -> None:
    run = tmp_path / "run"
    for step in (1, 2, 3):
        _save(run, step)
    elsewhere = _save(tmp_path / "other", 9)
    os.symlink(elsewhere, run / "step-000009")
    with pytest.warns(CorruptCheckpointWarning, match=r"ignoring .*step-000009: .* not a symbolic link"):
        removed = rotate_checkpoints(run, RetentionConfig(keep_last=1))
    assert [p.name for p in removed] == ["step-000001", "step-000002"]
    assert (run / "step-000009").is_symlink() and elsewhere.is_dir()  # neither followed nor deleted


def test_interrupted_saves_are_named_when_skipped_and_removed(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    good = _save(tmp_path, 1)
    half = tmp_path / "step-000002"
    half.mkdir()
    (half / "model.safetensors").write_bytes(b"partial")
    leftover = tmp_path / ".tmp-step-000003-77-abcd1234"
    leftover.mkdir()
    assert incomplete_checkpoints(tmp_path) == [leftover, half]
    with pytest.warns(CorruptCheckpointWarning) as record:
        assert latest_checkpoint(tmp_path) == good
    assert {str(w.message) for w in record} == {
        f"skipping {half}: an interrupted save (no COMPLETE marker); it is not a checkpoint",
        f"skipping {leftover}: an interrupted save (no COMPLETE marker); it is not a checkpoint",
    }
    with caplog.at_level(logging.WARNING, logger="aiayn.checkpoint.retention"):
        rotate_checkpoints(tmp_path, RetentionConfig(keep_last=1))
    assert f"removing {leftover}: the leftover of an interrupted save" in caplog.text and not leftover.exists()


def test_no_complete_checkpoint_left_names_the_interrupted_saves(tmp_path: Path) -> None:
    (tmp_path / "step-000002").mkdir()
    with pytest.warns(CorruptCheckpointWarning), pytest.raises(
        FileNotFoundError, match=r"no complete checkpoint in .*; interrupted saves \(no COMPLETE\): step-000002"
    ):
        latest_checkpoint(tmp_path)


def test_newer_checkpoints_are_set_aside_by_what_they_are(tmp_path: Path) -> None:
    for step in (1, 2, 3):
        _save(tmp_path, step)
    (tmp_path / "step-000003" / "trainer.json").write_text("{}")  # corrupt (hash)
    (tmp_path / "step-000004").mkdir()  # interrupted
    moved = set_aside_newer(tmp_path, 1)
    kinds = sorted(p.name.rsplit("-", 1)[0] for p in moved)
    assert kinds == ["corrupt-step-000003", "incomplete-step-000004", "superseded-step-000002"]
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-000001"]
    superseded = next(p for p in moved if p.name.startswith("superseded"))
    verify_checkpoint(superseded)  # a valid checkpoint, kept whole
