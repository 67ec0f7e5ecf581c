"""averaging: float64 mean of the last checkpoints, integer buffers from the last, atomic output."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from training_helpers import TinyModel, assert_same

from aiayn.checkpoint.averaging import average_checkpoints, average_last
from aiayn.checkpoint.state import CorruptCheckpointWarning, load_checkpoint, save_checkpoint


def _models(n: int, dtype: torch.dtype = torch.float32) -> list[TinyModel]:
    models = []
    for i in range(n):
        torch.manual_seed(i)
        model = TinyModel().to(dtype)
        model.counter.fill_(10 * (i + 1))
        models.append(model)
    return models


def _save_all(run: Path, models: list[TinyModel], config: dict | None = None) -> list[Path]:
    return [
        save_checkpoint(run, step=i + 1, model=m, config=config or {"d": 8}, save_rng=False) for i, m in enumerate(models)
    ]


def _reference(models: list[TinyModel]) -> dict[str, torch.Tensor]:
    states = [m.state_dict() for m in models]
    out = {}
    for name, t in states[-1].items():
        if t.is_floating_point():
            out[name] = (torch.stack([s[name].double() for s in states]).sum(0) / len(states)).to(t.dtype)
        else:
            out[name] = t
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_average_is_the_float64_mean_cast_back(tmp_path: Path, dtype: torch.dtype) -> None:
    models = _models(3, dtype)
    paths = _save_all(tmp_path, models)
    averaged = average_checkpoints(paths)
    assert_same(dict(sorted(averaged.items())), dict(sorted(_reference(models).items())))
    assert averaged["counter"].item() == 30  # integer buffers from the last
    assert averaged["out.weight"] is averaged["embed.weight"]  # tied weights stay tied


def test_average_differs_from_naive_half_precision_mean(tmp_path: Path) -> None:
    models = _models(3, torch.float16)
    averaged = average_checkpoints(_save_all(tmp_path, models))
    naive = (models[0].proj.weight + models[1].proj.weight + models[2].proj.weight) / 3
    assert not torch.equal(averaged["proj.weight"], naive.detach())


def test_average_of_safetensors_files_and_layout_mismatch(tmp_path: Path) -> None:
    paths = _save_all(tmp_path / "run", _models(2))
    files = [p / "model.safetensors" for p in paths]
    assert_same(average_checkpoints(files), average_checkpoints(paths))
    other = save_checkpoint(tmp_path / "other", step=1, model=TinyModel(d=6), config={}, save_rng=False)
    with pytest.raises(ValueError, match=rf"cannot average {other / 'model.safetensors'} with {files[0]}: .*embed.weight: \(11, 6\)"):
        average_checkpoints([files[0], other])
    untied = save_checkpoint(tmp_path / "untied", step=1, model=TinyModel(tied=False), config={}, save_rng=False)
    with pytest.raises(ValueError, match=r"tied weights differ"):
        average_checkpoints([files[0], untied])
    with pytest.raises(ValueError, match="average_checkpoints needs at least one path, got none"):
        average_checkpoints([])


def test_average_last_writes_a_complete_checkpoint(tmp_path: Path) -> None:
    models = _models(4)
    _save_all(tmp_path / "run", models)
    out = average_last(tmp_path / "run", 3, tmp_path / "avg")
    assert out == tmp_path / "avg"
    assert sorted(p.name for p in out.iterdir()) == ["COMPLETE", "config.json", "model.safetensors"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["avg", "run"]
    marker = json.loads((out / "COMPLETE").read_text())
    assert marker["step"] == 4 and marker["averaged_from"] == ["step-000002", "step-000003", "step-000004"]
    ckpt = load_checkpoint(out)
    assert ckpt.config == {"d": 8} and ckpt.optimizer_state is None and ckpt.trainer is None
    assert_same(dict(sorted(ckpt.model_state.items())), dict(sorted(_reference(models[1:]).items())))
    with pytest.raises(FileExistsError, match=rf"checkpoint directory already exists: {out}"):
        average_last(tmp_path / "run", 3, out)


def test_average_last_skips_corrupt_and_checks_counts_and_configs(tmp_path: Path) -> None:
    models = _models(3)
    paths = _save_all(tmp_path / "run", models)
    (paths[1] / "model.safetensors").write_bytes(b"garbage")
    with pytest.warns(CorruptCheckpointWarning, match=rf"not averaging step-000002: .*{paths[1] / 'model.safetensors'}"):
        out = average_last(tmp_path / "run", 2, tmp_path / "avg")
    assert json.loads((out / "COMPLETE").read_text())["averaged_from"] == ["step-000001", "step-000003"]
    with pytest.warns(CorruptCheckpointWarning), pytest.raises(
        ValueError, match=rf"average_last needs 3 complete checkpoints in {tmp_path / 'run'}, found 2"
    ):
        average_last(tmp_path / "run", 3, tmp_path / "avg3")
    save_checkpoint(tmp_path / "run", step=4, model=models[0], config={"d": 9}, save_rng=False)
    with pytest.raises(ValueError, match=r"cannot average checkpoints with different configs: .*step-000003/config.json vs .*step-000004/config.json"):
        average_last(tmp_path / "run", 2, tmp_path / "avg4")
    with pytest.raises(FileNotFoundError, match=rf"run directory does not exist: {tmp_path / 'nope'}"):
        average_last(tmp_path / "nope", 1, tmp_path / "x")
    with pytest.raises(ValueError, match=r"n must be an int >= 1, got 0"):
        average_last(tmp_path / "run", 0, tmp_path / "x")


def test_average_last_copies_extra_files_and_checks_tokenizers(tmp_path: Path) -> None:
    models = _models(3)
    files = tmp_path / "files"
    files.mkdir()
    (files / "tokenizer.json").write_text('{"vocab": "A"}')
    (files / "train_config.yaml").write_text("lr: 1\n")
    for i, model in enumerate(models[:2]):
        save_checkpoint(tmp_path / "run", step=i + 1, model=model, config={"d": 8}, save_rng=False,
                        extra_files=[files / "tokenizer.json", files / "train_config.yaml"])
    out = average_last(tmp_path / "run", 2, tmp_path / "avg")
    assert sorted(p.name for p in out.iterdir()) == ["COMPLETE", "config.json", "model.safetensors", "tokenizer.json", "train_config.yaml"]
    assert (out / "tokenizer.json").read_text() == '{"vocab": "A"}'
    assert load_checkpoint(out).extra_files == ("tokenizer.json", "train_config.yaml")  # listed in the marker, verified
    (files / "tokenizer.json").write_text('{"vocab": "B"}')
    save_checkpoint(tmp_path / "run", step=3, model=models[2], config={"d": 8}, save_rng=False, extra_files=[files / "tokenizer.json"])
    with pytest.raises(ValueError, match=r"different tokenizers: .*step-000002/tokenizer.json vs .*step-000003/tokenizer.json"):
        average_last(tmp_path / "run", 2, tmp_path / "avg2")


def test_a_model_field_missing_from_an_older_checkpoint_counts_as_its_default(tmp_path: Path) -> None:
    """Checkpoints saved before a model field existed average with newer ones (the field takes its default)."""
    from aiayn.models.config import EncoderDecoderConfig

    full = EncoderDecoderConfig(vocab_size=11, n_encoder_layers=1, n_decoder_layers=1, d_model=8, n_heads=2, d_ff=16).to_dict()
    older = {k: v for k, v in full.items() if k != "output_bias"}
    models = _models(2)
    save_checkpoint(tmp_path / "run", step=1, model=models[0], config=older, save_rng=False)
    save_checkpoint(tmp_path / "run", step=2, model=models[1], config=full, save_rng=False)
    average_last(tmp_path / "run", 2, tmp_path / "avg")  # no error
    save_checkpoint(tmp_path / "run", step=3, model=models[1], config={**full, "d_ff": 32}, save_rng=False)
    with pytest.raises(ValueError, match="different configs"):
        average_last(tmp_path / "run", 2, tmp_path / "avg2")


def _count_hashes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    from aiayn.checkpoint import atomic_io

    hashed: list[str] = []
    real = atomic_io.file_sha256

    def counting(file: Path) -> str:
        hashed.append(f"{file.parent.name}/{file.name}")
        return real(file)

    monkeypatch.setattr(atomic_io, "file_sha256", counting)
    return hashed


def test_each_checkpoint_is_hashed_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """average_last verified, then averaged (verifying again): every file hashed twice. Now once; and
    resuming (latest_checkpoint, then load_checkpoint) hashes the newest checkpoint once."""
    from aiayn.checkpoint.state import latest_checkpoint

    _save_all(tmp_path / "run", _models(3))
    hashed = _count_hashes(monkeypatch)
    average_last(tmp_path / "run", 2, tmp_path / "avg")
    assert sorted(hashed) == sorted(set(hashed)) and "step-000002/model.safetensors" in hashed
    hashed.clear()
    load_checkpoint(latest_checkpoint(tmp_path / "run"), verified=True)
    assert sorted(hashed) == sorted(set(hashed)) and "step-000003/model.safetensors" in hashed
    hashed.clear()
    load_checkpoint(tmp_path / "run" / "step-000001")  # a checkpoint nobody verified is hashed
    assert "step-000001/model.safetensors" in hashed
