"""checkpoint: layout, exact resume, atomic writes, corruption, strict weights loading."""

from __future__ import annotations

import errno
import hashlib
import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from training_helpers import TinyModel, assert_same

from aiayn.checkpoint import atomic_io
from aiayn.checkpoint.state import (
    BestValue,
    CorruptCheckpointError,
    CorruptCheckpointWarning,
    checkpoint_name,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    load_model_weights,
    resolve_checkpoint,
    restore_training_state,
    save_checkpoint,
    verify_checkpoint,
)
from aiayn.config_io import from_dict, to_dict
from aiayn.training.losses import label_smoothed_cross_entropy
from aiayn.training.optim import OptimConfig, ScheduleConfig, build_optimizer, build_scheduler


@dataclass(frozen=True)
class TinyConfig:
    vocab: int = 11
    d: int = 8


def _setup(seed: int) -> tuple[TinyModel, torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    torch.manual_seed(seed)
    model = TinyModel()
    opt = build_optimizer(model, OptimConfig(name="adamw", lr=1e-2, weight_decay=0.1))
    return model, opt, build_scheduler(opt, ScheduleConfig(name="cosine", warmup=2, max_steps=20))


def _train(model: TinyModel, opt: torch.optim.Optimizer, sched: torch.optim.lr_scheduler.LRScheduler, n: int) -> list[float]:
    """n steps whose data and dropout draw from the torch, numpy and Python generators."""
    losses = []
    for _ in range(n):
        ids = torch.randint(1, 11, (4, 5))
        ids[0, 0] = random.randrange(1, 11)
        ids[1, 0] = int(np.random.randint(1, 11))
        opt.zero_grad()
        loss = label_smoothed_cross_entropy(model(ids), ids, pad_id=0)
        (loss.sum / loss.count).backward()
        opt.step()
        sched.step()
        model.counter += 1
        losses.append(loss.sum.item())
    return losses


def _save(run: Path, step: int, model: TinyModel | None = None, **kwargs: object) -> Path:
    model = model if model is not None else TinyModel()
    return save_checkpoint(run, step=step, model=model, config=TinyConfig(), **kwargs)  # type: ignore[arg-type]


EXPECTED_FILES = {
    "model.safetensors",
    "config.json",
    "optimizer.safetensors",
    "optimizer.json",
    "trainer.json",
    "rng.safetensors",
    "rng.json",
    "tokenizer.json",
    "COMPLETE",
}


def test_layout_and_marker(tmp_path: Path) -> None:
    model, opt, sched = _setup(0)
    _train(model, opt, sched, 2)
    tokenizer = tmp_path / "tokenizer.json"
    tokenizer.write_text('{"vocab": []}')
    path = _save(tmp_path / "run", 123, model, optimizer=opt, scheduler=sched, extra_files=[tokenizer])
    assert path == tmp_path / "run" / "step-000123"
    assert {p.name for p in path.iterdir()} == EXPECTED_FILES
    assert [p.name for p in (tmp_path / "run").iterdir()] == ["step-000123"]  # no temporary left
    marker = json.loads((path / "COMPLETE").read_text())
    assert marker["format"] == 1 and marker["step"] == 123
    assert set(marker["files"]) == EXPECTED_FILES - {"COMPLETE"}
    for name, entry in marker["files"].items():
        data = (path / name).read_bytes()
        assert entry == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    assert json.loads((path / "config.json").read_text()) == {"vocab": 11, "d": 8}


def test_load_round_trips_every_part_exactly(tmp_path: Path) -> None:
    model, opt, sched = _setup(0)
    _train(model, opt, sched, 3)
    tokenizer = tmp_path / "tokenizer.json"
    tokenizer.write_text("{}")
    best = BestValue(metric="val_loss", mode="min", value=2.5, step=3)
    path = _save(
        tmp_path / "run", 3, model, optimizer=opt, scheduler=sched, data_state={"epoch": 1, "offsets": [3, 4]},
        metrics={"val_loss": 2.5, "bleu": 20}, best=best, extra_files=[tokenizer],
    )  # fmt: skip
    ckpt = load_checkpoint(path)
    assert ckpt.path == path and ckpt.step == 3
    assert from_dict(TinyConfig, ckpt.config) == TinyConfig()
    assert_same(dict(sorted(ckpt.model_state.items())), dict(sorted(model.state_dict().items())))
    assert_same(ckpt.optimizer_state, opt.state_dict())
    assert ckpt.trainer is not None
    assert ckpt.trainer.step == 3 and ckpt.trainer.scheduler == sched.state_dict()
    assert ckpt.trainer.data == {"epoch": 1, "offsets": [3, 4]}
    assert ckpt.trainer.metrics == {"val_loss": 2.5, "bleu": 20.0} and ckpt.trainer.best == best
    assert ckpt.rng is not None and torch.equal(ckpt.rng.tensors["torch.cpu"], torch.get_rng_state())
    assert ckpt.extra_files == ("tokenizer.json",)


@pytest.mark.reliability
def test_resume_continues_bit_for_bit(tmp_path: Path) -> None:
    model, opt, sched = _setup(0)
    _train(model, opt, sched, 3)
    _save(tmp_path, 3, model, optimizer=opt, scheduler=sched, data_state={"offset": 12})
    expected = _train(model, opt, sched, 3)

    model2, opt2, sched2 = _setup(123)
    ckpt = load_checkpoint(latest_checkpoint(tmp_path))
    restore_training_state(ckpt, model=model2, optimizer=opt2, scheduler=sched2)
    assert _train(model2, opt2, sched2, 3) == expected
    assert_same(model2.state_dict(), model.state_dict())
    assert_same(opt2.state_dict(), opt.state_dict())
    assert sched2.state_dict() == sched.state_dict()
    assert model2.out.weight is model2.embed.weight  # still tied


def test_resume_without_rng_differs(tmp_path: Path) -> None:
    model, opt, sched = _setup(0)
    _save(tmp_path, 0, model, optimizer=opt, scheduler=sched)
    expected = _train(model, opt, sched, 2)
    model2, opt2, sched2 = _setup(1)
    restore_training_state(load_checkpoint(tmp_path / "step-000000"), model=model2, optimizer=opt2, scheduler=sched2, rng=False)
    assert _train(model2, opt2, sched2, 2) != expected


@pytest.mark.reliability
def test_saving_the_same_step_twice_fails(tmp_path: Path) -> None:
    _save(tmp_path, 1)
    with pytest.raises(FileExistsError, match=rf"checkpoint directory already exists: {tmp_path / 'step-000001'}"):
        _save(tmp_path, 1)


@pytest.mark.reliability
def test_disk_full_removes_the_partial_checkpoint_and_keeps_the_previous(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model, opt, sched = _setup(0)
    first = _save(tmp_path, 1, model, optimizer=opt, scheduler=sched)
    real_write = atomic_io.write_durable

    def full_disk(path: Path, data: bytes) -> None:
        if path.name == "optimizer.safetensors":
            real_write(path, data[: len(data) // 2])
            raise OSError(errno.ENOSPC, "No space left on device")
        real_write(path, data)

    monkeypatch.setattr(atomic_io, "write_durable", full_disk)
    with pytest.raises(OSError) as info:
        _save(tmp_path, 2, model, optimizer=opt, scheduler=sched)
    assert info.value.errno == errno.ENOSPC
    assert str(tmp_path / "step-000002") in str(info.value) and "optimizer.safetensors" in str(info.value)
    assert [p.name for p in tmp_path.iterdir()] == ["step-000001"]
    monkeypatch.undo()
    verify_checkpoint(first)
    assert latest_checkpoint(tmp_path) == first


@pytest.mark.reliability
def test_non_finite_weights_are_never_written(tmp_path: Path) -> None:
    model = TinyModel()
    with torch.no_grad():
        model.proj.weight[0, 1] = float("nan")
        model.norm.bias[0] = float("inf")
    with pytest.raises(ValueError, match=r"weight 'proj.weight' has 1 non-finite values \(of 64, shape \(8, 8\)\)"):
        _save(tmp_path / "run", 1, model)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"metrics": {"val_loss": float("nan")}}, ValueError, r"metrics\['val_loss'\] must be a finite number, got nan"),
        ({"metrics": {"val_loss": "low"}}, ValueError, r"metrics\['val_loss'\] must be a finite number, got 'low'"),
        ({"data_state": {"pos": object()}}, TypeError, r"cannot store trainer state \(data_state, metrics\) as JSON"),
    ],
)
def test_bad_trainer_state_is_refused_before_writing(tmp_path: Path, kwargs: dict, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        _save(tmp_path, 1, **kwargs)
    assert list(tmp_path.iterdir()) == []


def test_extra_file_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=rf"extra file to copy into the checkpoint does not exist: {tmp_path / 'tok.json'}"):
        _save(tmp_path / "run", 1, extra_files=[tmp_path / "tok.json"])
    clash = tmp_path / "config.json"
    clash.write_text("{}")
    with pytest.raises(ValueError, match=rf"extra file {clash} clashes with a checkpoint file named 'config.json'"):
        _save(tmp_path / "run", 1, extra_files=[clash])
    assert not (tmp_path / "run").exists() or list((tmp_path / "run").iterdir()) == []


def test_config_must_be_a_dataclass_or_mapping(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="config must be a dataclass instance or a mapping, got list"):
        save_checkpoint(tmp_path, step=1, model=TinyModel(), config=[1])
    path = save_checkpoint(tmp_path, step=2, model=TinyModel(), config={"vocab": 3}, save_rng=False)
    assert load_checkpoint(path).config == {"vocab": 3} and load_checkpoint(path).rng is None


def test_checkpoint_name_rejects_bad_steps() -> None:
    assert checkpoint_name(0) == "step-000000" and checkpoint_name(12345678) == "step-12345678"
    with pytest.raises(ValueError, match=r"step must be an int >= 0, got -1"):
        checkpoint_name(-1)


def _rewrite(path: Path, name: str, data: bytes, update_marker: bool) -> None:
    (path / name).write_bytes(data)
    if update_marker:  # a consistent marker: only parsing can catch the problem
        marker = json.loads((path / "COMPLETE").read_text())
        marker["files"][name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        (path / "COMPLETE").write_text(json.dumps(marker))


def _truncate(path: Path) -> str:
    data = (path / "optimizer.safetensors").read_bytes()
    _rewrite(path, "optimizer.safetensors", data[:-10], update_marker=False)
    return "optimizer.safetensors: size is"


def _flip_byte(path: Path) -> str:
    data = bytearray((path / "model.safetensors").read_bytes())
    data[-1] ^= 0xFF
    _rewrite(path, "model.safetensors", bytes(data), update_marker=False)
    return "model.safetensors: sha256"


def _bad_json(path: Path) -> str:
    _rewrite(path, "trainer.json", b'{"step": ', update_marker=True)
    return "trainer.json: invalid JSON"


def _bad_safetensors(path: Path) -> str:
    _rewrite(path, "rng.safetensors", b"\x08\x00\x00\x00\x00\x00\x00\x00{}", update_marker=True)
    return "rng.safetensors: header of 8 bytes runs past the end of the file"


def _missing_file(path: Path) -> str:
    (path / "rng.json").unlink()
    return "rng.json: listed in COMPLETE but missing"


def _bad_marker(path: Path) -> str:
    (path / "COMPLETE").write_text("{oops")
    return "COMPLETE: invalid JSON"


def _bad_optimizer_json(path: Path) -> str:
    _rewrite(path, "optimizer.json", b'{"format": 1, "state": {"__tensor__": "gone"}}', update_marker=True)
    return "optimizer.json: unexpected contents"


def _marker_without_step(path: Path) -> str:
    marker = json.loads((path / "COMPLETE").read_text())
    del marker["step"]
    (path / "COMPLETE").write_text(json.dumps(marker))
    return "COMPLETE: expected an int 'step', got None"


def _unpaired_optimizer_file(path: Path) -> str:
    marker = json.loads((path / "COMPLETE").read_text())
    del marker["files"]["optimizer.json"]
    (path / "COMPLETE").write_text(json.dumps(marker))
    return "optimizer.json: not listed in COMPLETE although optimizer.safetensors is"


@pytest.mark.parametrize(
    "corrupt",
    [_truncate, _flip_byte, _bad_json, _bad_safetensors, _missing_file, _bad_marker, _marker_without_step, _unpaired_optimizer_file],
)
@pytest.mark.reliability
def test_corrupt_newest_is_skipped_with_a_warning_and_refused_by_load(tmp_path: Path, corrupt: Callable[[Path], str]) -> None:
    model, opt, sched = _setup(0)
    good = _save(tmp_path, 1, model, optimizer=opt, scheduler=sched)
    bad = _save(tmp_path, 2, model, optimizer=opt, scheduler=sched)
    expected = corrupt(bad)
    with pytest.warns(CorruptCheckpointWarning, match=rf"skipping checkpoint step-000002: corrupt checkpoint file {bad}/{expected}"):
        assert latest_checkpoint(tmp_path) == good
    with pytest.raises(CorruptCheckpointError, match=rf"corrupt checkpoint file {bad}/{expected}"):
        load_checkpoint(bad)


def test_load_refuses_an_optimizer_state_that_does_not_decode(tmp_path: Path) -> None:
    model, opt, sched = _setup(0)
    path = _save(tmp_path, 1, model, optimizer=opt, scheduler=sched)
    expected = _bad_optimizer_json(path)
    with pytest.raises(CorruptCheckpointError, match=rf"corrupt checkpoint file {path}/{expected}"):
        load_checkpoint(path)


@pytest.mark.reliability
def test_a_directory_without_marker_is_not_a_checkpoint(tmp_path: Path) -> None:
    good = _save(tmp_path, 1)
    partial = _save(tmp_path, 2)
    (partial / "COMPLETE").unlink()
    assert list_checkpoints(tmp_path) == [good]
    assert latest_checkpoint(tmp_path) == good
    with pytest.raises(FileNotFoundError, match=rf"{partial} is not a complete checkpoint: it has no COMPLETE marker"):
        resolve_checkpoint(partial)
    with pytest.raises(FileNotFoundError, match=rf"{partial} is not a complete checkpoint"):
        load_checkpoint(partial)


@pytest.mark.reliability
def test_missing_or_empty_resume_paths_are_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=rf"resume path does not exist: {tmp_path / 'nope'}"):
        latest_checkpoint(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match=rf"resume path does not exist: {tmp_path / 'nope'}"):
        resolve_checkpoint(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match=rf"no complete checkpoint in {tmp_path} \(a step-NNNNNN directory"):
        latest_checkpoint(tmp_path)
    bad = _save(tmp_path, 1)
    _truncate_model = (bad / "model.safetensors").read_bytes()[:-1]
    (bad / "model.safetensors").write_bytes(_truncate_model)
    with pytest.warns(CorruptCheckpointWarning), pytest.raises(
        FileNotFoundError, match=rf"no complete checkpoint in {tmp_path}; skipped corrupt ones: corrupt checkpoint file {bad}/model.safetensors"
    ):
        latest_checkpoint(tmp_path)
    assert list_checkpoints(tmp_path / "nope") == []


def test_resolve_accepts_a_checkpoint_or_a_run_directory(tmp_path: Path) -> None:
    first, second = _save(tmp_path, 1), _save(tmp_path, 10)
    assert resolve_checkpoint(first) == first
    assert resolve_checkpoint(tmp_path) == second
    with pytest.raises(NotADirectoryError, match=rf"must be a checkpoint or run directory, got the file {first / 'config.json'}"):
        resolve_checkpoint(first / "config.json")
    assert list_checkpoints(tmp_path) == [first, second]  # numeric order


def test_load_model_weights_from_every_source(tmp_path: Path) -> None:
    source = TinyModel()
    path = _save(tmp_path / "run", 1, source)
    for where, expected_file in (
        (path, path / "model.safetensors"),
        (tmp_path / "run", path / "model.safetensors"),
        (path / "model.safetensors", path / "model.safetensors"),
    ):
        target = TinyModel()
        assert load_model_weights(target, where) == expected_file
        assert_same(target.state_dict(), source.state_dict())
    torch.save(source.state_dict(), tmp_path / "w.pt")
    with pytest.raises(ValueError, match=rf"refusing to load {tmp_path / 'w.pt'}"):
        load_model_weights(TinyModel(), tmp_path / "w.pt")
    target = TinyModel()
    load_model_weights(target, tmp_path / "w.pt", trust_pickle=True)
    assert_same(target.state_dict(), source.state_dict())


def test_load_model_weights_into_a_changed_model_lists_the_mismatches(tmp_path: Path) -> None:
    path = _save(tmp_path, 1, TinyModel(vocab=11, d=8))
    target = TinyModel(vocab=11, d=6, tied=False)
    before = {k: v.clone() for k, v in target.state_dict().items()}
    with pytest.raises(ValueError) as info:
        load_model_weights(target, path)
    msg = str(info.value)
    assert f"weights in {path / 'model.safetensors'} do not match the model" in msg
    assert "shape mismatches (6): embed.weight: file (11, 8), model (11, 6)" in msg
    assert_same(dict(target.state_dict()), before)


def test_restore_names_missing_parts(tmp_path: Path) -> None:
    ckpt = load_checkpoint(_save(tmp_path, 1, save_rng=False))
    model, opt, sched = _setup(0)
    with pytest.raises(ValueError, match=rf"checkpoint {ckpt.path} holds no optimizer state"):
        restore_training_state(ckpt, optimizer=opt, rng=False)
    with pytest.raises(ValueError, match=rf"checkpoint {ckpt.path} holds no scheduler state"):
        restore_training_state(ckpt, scheduler=sched, rng=False)
    with pytest.raises(ValueError, match=rf"checkpoint {ckpt.path} holds no rng state; pass rng=False"):
        restore_training_state(ckpt)


def test_config_dataclass_is_stored_with_to_dict(tmp_path: Path) -> None:
    path = save_checkpoint(tmp_path, step=1, model=TinyModel(), config=TinyConfig(vocab=5))
    assert json.loads((path / "config.json").read_text()) == to_dict(TinyConfig(vocab=5))


@dataclass(frozen=True)
class FamilyConfig:
    d: int = 4

    def to_dict(self) -> dict[str, object]:
        return {"family": "tiny", "d": self.d}


def test_a_config_with_its_own_to_dict_is_stored_with_it(tmp_path: Path) -> None:
    path = save_checkpoint(tmp_path, step=1, model=TinyModel(), config=FamilyConfig(), save_rng=False)
    assert load_checkpoint(path).config == {"family": "tiny", "d": 4}


def test_a_sharded_save_writes_what_a_plain_one_does_and_resumes_the_scaler(tmp_path: Path) -> None:
    """One writer for both kinds: the sharded save's trainer record holds fp16's scaler (it once did not),
    its marker lists the DCP shards and the same files, and a resume puts the scale back."""
    import torch.distributed as dist

    from aiayn.checkpoint.sharded import save_sharded_checkpoint
    from aiayn.training.loop import _restore_scaler

    model, opt, sched = _setup(0)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    common = dict(model=model, optimizer=opt, config=TinyConfig(), scheduler=sched, data_state={"pos": 3},
                  metrics={"val_loss": 1.5}, best=None, extra_files=(), ranks=(), scaler=scaler.state_dict())
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        sharded = save_sharded_checkpoint(tmp_path / "sharded", step=3, **common)
    finally:
        dist.destroy_process_group()
    assert sharded is not None
    plain = save_checkpoint(tmp_path / "plain", step=3, **common)
    marker = json.loads((sharded / "COMPLETE").read_text())
    assert marker["sharded"] == "dcp" and "dcp/.metadata" in marker["files"]
    plain_files = set(json.loads((plain / "COMPLETE").read_text())["files"])
    beside_shards = {n for n in marker["files"] if not n.startswith("dcp/")}
    assert beside_shards == plain_files - {"model.safetensors", "optimizer.safetensors", "optimizer.json"}
    assert (sharded / "trainer.json").read_bytes() == (plain / "trainer.json").read_bytes()

    resumed = load_checkpoint(sharded, sharded=True)
    assert resumed.trainer is not None and resumed.trainer.scaler == scaler.state_dict()
    fresh = torch.amp.GradScaler("cpu")
    _restore_scaler(fresh, resumed)
    assert fresh.get_scale() == 2.0**10
    with pytest.raises(ValueError, match="sharded .*DCP.* train.parallel=fsdp"):
        load_checkpoint(sharded)
    with pytest.raises(ValueError, match="plain checkpoint .* train.parallel=fsdp resumes only"):
        load_checkpoint(plain, sharded=True)


def test_the_trainer_record_holds_the_kernels_chosen_and_a_malformed_record_is_corrupt(tmp_path: Path) -> None:
    """A checkpoint records the kernels its run chose (a resume pins them: tests/training/test_loop.py); a record of
    another form makes trainer.json corrupt, naming it."""
    from aiayn.checkpoint.state import read_trainer_state
    from aiayn.inference.kernel_choice import choices_made

    model, opt, sched = _setup(0)
    path = save_checkpoint(tmp_path, step=1, model=model, optimizer=opt, config=TinyConfig(), scheduler=sched)
    loaded = load_checkpoint(path)
    assert loaded.trainer is not None and loaded.trainer.kernels == choices_made()
    trainer = json.loads((path / "trainer.json").read_text())
    (path / "trainer.json").write_text(json.dumps({**trainer, "kernels": {"machine": "x", "choices": {"a": 1}}}))
    with pytest.raises(CorruptCheckpointError, match="trainer.json.*kernels must be"):
        read_trainer_state(path)
