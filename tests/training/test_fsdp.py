"""``train.parallel: fsdp``: sharded training equals one process, DCP checkpoints resume at any world size,
consolidation gives an ordinary model directory, and the kinds of checkpoint are never confused."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from loop_fixtures import save_config, translation_config

from aiayn.checkpoint.sharded import is_sharded, read_sharded_model_state
from aiayn.checkpoint.state import load_checkpoint
from aiayn.cli.main import main
from aiayn.models.config import config_from_dict
from aiayn.models.presets import model_class
from aiayn.pretrained import load_pretrained
from aiayn.training.loop import train
from aiayn.training.metrics_log import read_metrics

ROOT = Path(__file__).resolve().parents[2]


def fsdp_config(tmp: Path, *, steps: int = 4, **loop: object):
    config = translation_config(tmp, steps=steps, dropout=0.0, save_every=2, **loop)
    return dataclasses.replace(config, train=dataclasses.replace(config.train, parallel="fsdp"))


def replace_loop(config, **changes):
    return dataclasses.replace(config, train=dataclasses.replace(config.train, **changes))


def torchrun(config_path: Path, *args: str, nproc: int = 2) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           "-m", "aiayn", "train", str(config_path), *args]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-4000:]


def step_losses(run_dir: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(run_dir) if "loss" in r}


def sharded_weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    """The whole model of a sharded checkpoint, read in this process (no process group)."""
    cfg = config_from_dict(load_checkpoint(checkpoint, sharded=True).config)
    return read_sharded_model_state(checkpoint, model_class(cfg)(cfg))


def assert_close_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], tol: float) -> None:
    assert a.keys() == b.keys()
    for name in a:
        if name.endswith("w_k.bias"):  # a true gradient of 0 (softmax ignores it): Adam amplifies rounding noise
            continue
        torch.testing.assert_close(a[name], b[name], atol=tol, rtol=tol, msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.slow
def test_fsdp_two_ranks_equal_one_process_and_resume_at_any_world_size(tmp_path):
    """One chain of runs (each torchrun launch costs ~30 s here), checking, in order:

    * 2 FSDP ranks for 4 steps == 1 process accumulating 2 micro-batches: losses and weights within 1e-5;
    * the step-2 checkpoint of that run resumed by 2 ranks: bit for bit;
    * the same checkpoint resumed by 1 rank (2 -> 1): losses within 1e-6 of the straight run, weights 1e-5;
    * a 1-rank checkpoint resumed by 2 ranks (1 -> 2): the same;
    * consolidation: the model directory scores the same loss as the checkpoint's weights.
    """
    straight = fsdp_config(tmp_path / "a")
    torchrun(save_config(straight, tmp_path / "a.yaml"))
    single = train(replace_loop(translation_config(tmp_path / "one", steps=4, dropout=0.0, save_every=2), accumulate=2))
    losses = step_losses(tmp_path / "a" / "run")
    assert sorted(losses) == [1, 2, 3, 4]
    for step, loss in step_losses(single.run_dir).items():
        assert losses[step] == pytest.approx(loss, abs=1e-5)
    final = tmp_path / "a" / "run" / "step-000004"
    assert is_sharded(final) and (final / "dcp" / ".metadata").is_file()
    with pytest.raises(ValueError, match=r"sharded \(DCP\) checkpoint written with train.parallel=fsdp"):
        load_checkpoint(final)  # a DCP checkpoint read as a plain one
    assert_close_weights(sharded_weights(final), single.model.state_dict(), 1e-5)

    # 2 -> 2, bit for bit: the straight run's step-2 checkpoint, continued by 2 ranks
    b = fsdp_config(tmp_path / "b")
    shutil.copytree(tmp_path / "a" / "run" / "step-000002", Path(b.run_dir) / "step-000002")
    torchrun(save_config(b, tmp_path / "b.yaml"))
    assert {step: loss for step, loss in step_losses(tmp_path / "b" / "run").items() if step > 2} == {3: losses[3], 4: losses[4]}
    resumed = sharded_weights(tmp_path / "b" / "run" / "step-000004")
    for name, tensor in sharded_weights(final).items():
        assert torch.equal(tensor, resumed[name]), name

    # 2 -> 1: the step-2 checkpoint of the 2-rank run, continued by one rank accumulating 2 micro-batches
    c = replace_loop(fsdp_config(tmp_path / "c"), accumulate=2)
    c_path = save_config(c, tmp_path / "c.yaml")
    run_c = Path(c.run_dir)
    shutil.copytree(tmp_path / "b" / "run" / "step-000002", run_c / "step-000002")
    torchrun(c_path, nproc=1)
    for step in (3, 4):
        assert step_losses(run_c)[step] == pytest.approx(losses[step], abs=1e-6)
    # weights 1e-5, as for 2 ranks against one process: Adam's normalised steps amplify the rounding of a
    # different reduction order to 2e-6 on an AVX2 CPU (the losses stay within 1e-6)
    assert_close_weights(sharded_weights(run_c / "step-000004"), sharded_weights(final), 1e-5)

    # 1 -> 2: one rank (accumulating 2) stopped at step 2, continued by two ranks
    d = replace_loop(fsdp_config(tmp_path / "d"), accumulate=2, stop_after=2)
    torchrun(save_config(d, tmp_path / "d.yaml"), nproc=1)
    e = fsdp_config(tmp_path / "d")  # the same run dir, 2 ranks, 1 micro-batch each
    torchrun(save_config(e, tmp_path / "e.yaml"))
    for step in (3, 4):
        assert step_losses(Path(e.run_dir))[step] == pytest.approx(losses[step], abs=1e-6)
    assert_close_weights(sharded_weights(Path(e.run_dir) / "step-000004"), sharded_weights(final), 1e-5)

    # consolidation: an ordinary model directory that loads and scores the same loss
    out = tmp_path / "consolidated"
    assert main(["consolidate", str(final), str(out)]) == 0  # the command, in this process (no process group)
    assert not is_sharded(out) and (out / "model.safetensors").is_file()
    direct, from_dir = load_pretrained(final), load_pretrained(out)
    for name, tensor in direct.model.state_dict().items():
        assert torch.equal(tensor, from_dir.model.state_dict()[name]), name
    ids = torch.randint(4, direct.config.vocab_size, (2, 6))
    torch.testing.assert_close(direct.model(ids, ids), from_dir.model(ids, ids), atol=0, rtol=0)


def test_fsdp_outside_torchrun_is_refused(tmp_path, monkeypatch):
    for name in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ValueError, match="train.parallel='fsdp' needs torchrun"):
        train(fsdp_config(tmp_path))


def test_cpu_offload_without_a_gpu_is_refused(tmp_path):
    config = fsdp_config(tmp_path)
    with pytest.raises(ValueError, match="train.cpu_offload=true moves FSDP shards from the GPU .* device is cpu"):
        train(replace_loop(config, cpu_offload=True, device="cpu"))


def test_muon_with_fsdp_is_refused(tmp_path):
    from aiayn.training.optim import OptimConfig

    with pytest.raises(ValueError, match="optim.name='muon' with train.parallel='fsdp'"):
        dataclasses.replace(fsdp_config(tmp_path), optim=OptimConfig(name="muon", lr=1e-3))


def test_a_plain_checkpoint_is_not_read_as_sharded(tmp_path):
    result = train(translation_config(tmp_path, steps=2, dropout=0.0, save_every=2))
    with pytest.raises(ValueError, match="plain checkpoint .* train.parallel=fsdp resumes only"):
        load_checkpoint(result.last_checkpoint, sharded=True)
    assert not is_sharded(result.last_checkpoint)
    load_checkpoint(result.last_checkpoint)  # and it still loads as what it is
