"""retention: keep the last K and the best; never delete the newest or the best."""

from __future__ import annotations

from pathlib import Path

import pytest
from training_helpers import TinyModel

from aiayn.checkpoint.retention import RetentionConfig, best_checkpoint, is_better, rotate_checkpoints, update_best
from aiayn.checkpoint.state import BestValue, CorruptCheckpointWarning, list_checkpoints, read_trainer_state, save_checkpoint


def _run(tmp_path: Path, values: list[float], retention: RetentionConfig) -> list[list[str]]:
    """Save one checkpoint per value (steps 1..n), rotating after each; the names removed each time."""
    model = TinyModel()
    best = None
    removed = []
    for step, value in enumerate(values, start=1):
        metrics = {"val_loss": value}
        best = update_best(best, metrics, step=step, retention=retention)
        save_checkpoint(tmp_path, step=step, model=model, config={}, metrics=metrics, best=best, save_rng=False)
        removed.append([p.name for p in rotate_checkpoints(tmp_path, retention)])
    return removed


def _names(run: Path) -> list[str]:
    return [p.name for p in list_checkpoints(run)]


def test_keeps_last_k_and_the_best_lower_is_better(tmp_path: Path) -> None:
    removed = _run(tmp_path, [5.0, 1.0, 4.0, 3.0, 2.0], RetentionConfig(keep_last=2, metric="val_loss", mode="min"))
    assert removed == [[], [], ["step-000001"], [], ["step-000003"]]
    assert _names(tmp_path) == ["step-000002", "step-000004", "step-000005"]
    trainer = read_trainer_state(tmp_path / "step-000005")
    assert trainer is not None and trainer.best == BestValue(metric="val_loss", mode="min", value=1.0, step=2)


def test_higher_is_better(tmp_path: Path) -> None:
    _run(tmp_path, [5.0, 1.0, 4.0, 3.0, 2.0], RetentionConfig(keep_last=1, metric="val_loss", mode="max"))
    assert _names(tmp_path) == ["step-000001", "step-000005"]
    assert best_checkpoint(tmp_path, metric="val_loss", mode="max") == tmp_path / "step-000001"


def test_without_metric_keeps_only_the_last(tmp_path: Path) -> None:
    _run(tmp_path, [3.0, 2.0, 1.0], RetentionConfig(keep_last=1, metric=None))
    assert _names(tmp_path) == ["step-000003"]
    assert best_checkpoint(tmp_path, metric="bleu", mode="max") is None


def test_newest_that_is_also_best_is_kept_once(tmp_path: Path) -> None:
    _run(tmp_path, [3.0, 2.0, 1.0], RetentionConfig(keep_last=1, metric="val_loss"))
    assert _names(tmp_path) == ["step-000003"]


@pytest.mark.reliability
def test_a_corrupt_newest_stops_rotation(tmp_path: Path) -> None:
    _run(tmp_path, [3.0, 2.0], RetentionConfig(keep_last=5, metric=None))
    newest = tmp_path / "step-000002"
    (newest / "model.safetensors").write_bytes((newest / "model.safetensors").read_bytes()[:-4])
    with pytest.warns(CorruptCheckpointWarning, match=rf"not rotating checkpoints in {tmp_path}: newest is corrupt: .*{newest}/model.safetensors"):
        assert rotate_checkpoints(tmp_path, RetentionConfig(keep_last=1, metric=None)) == []
    assert _names(tmp_path) == ["step-000001", "step-000002"]


@pytest.mark.reliability
def test_leftovers_of_interrupted_saves_are_removed(tmp_path: Path) -> None:
    _run(tmp_path, [1.0], RetentionConfig(keep_last=1, metric=None))
    (tmp_path / ".tmp-step-000002-1-abcd").mkdir()
    (tmp_path / ".tmp-step-000002-1-abcd" / "model.safetensors").write_bytes(b"partial")
    (tmp_path / "notes").mkdir()
    assert rotate_checkpoints(tmp_path, RetentionConfig(keep_last=1, metric=None)) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes", "step-000001"]


def test_rotating_an_empty_or_missing_run_does_nothing(tmp_path: Path) -> None:
    assert rotate_checkpoints(tmp_path / "missing", RetentionConfig()) == []


def test_update_best_and_is_better() -> None:
    cfg = RetentionConfig(metric="bleu", mode="max")
    best = update_best(None, {"loss": 1.0}, step=1, retention=cfg)
    assert best is None
    best = update_best(best, {"bleu": 20.0}, step=2, retention=cfg)
    assert best == BestValue("bleu", "max", 20.0, 2)
    assert update_best(best, {"bleu": 20.0}, step=3, retention=cfg) == best  # ties keep the earlier
    assert update_best(best, {"bleu": 21}, step=4, retention=cfg) == BestValue("bleu", "max", 21.0, 4)
    assert is_better(1.0, 2.0, "min") and not is_better(1.0, 2.0, "max")
    with pytest.raises(ValueError, match="mode must be one of min, max, got 'avg'"):
        is_better(1.0, 2.0, "avg")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"keep_last": 0}, r"keep_last must be an int >= 1, got 0"),
        ({"keep_last": True}, r"keep_last must be an int >= 1, got True"),
        ({"mode": "avg"}, r"mode must be one of min, max, got 'avg'"),
        ({"metric": ""}, r"metric must be a metric name or None, got ''"),
    ],
)
def test_retention_config_validation(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RetentionConfig(**kwargs)
