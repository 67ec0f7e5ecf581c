"""The WMT14 recipe, shrunk to a tiny model, on prepared shards under ``torchrun --nproc-per-node=2`` (gloo):
the two ranks read disjoint batches and train as one process that accumulates their micro-batches."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from loop_fixtures import save_config, write_parallel

from aiayn.checkpoint.weights import read_safetensors
from aiayn.config_io import apply_overrides, load_yaml
from aiayn.data.prepared import PrepareSettings, prepare
from aiayn.recipes import recipe_path
from aiayn.training.config import TrainConfig
from aiayn.training.loop import train
from aiayn.training.metrics_log import read_metrics
from aiayn.training.tasks import build_task_data

ROOT = Path(__file__).resolve().parents[2]
STEPS = 2


def shrunk_recipe(run_dir: Path, prepared: Path) -> TrainConfig:
    """wmt14-en-de-base with everything but its training settings made tiny (dropout 0: ranks draw their own masks)."""
    return apply_overrides(load_yaml(recipe_path("wmt14-en-de-base"), TrainConfig), [
        f"run_dir={run_dir}", f"data.prepared={prepared}", "data.max_tokens=120", "data.num_workers=0",
        "model.d_model=16", "model.d_ff=32", "model.n_heads=2", "model.n_encoder_layers=1", "model.n_decoder_layers=1",
        "model.dropout=0.0", "schedule.warmup=2", f"train.max_steps={STEPS}", f"train.eval_every={STEPS}",
        f"train.save_every={STEPS}", "train.save_every_minutes=null", "train.log_every=1", "train.progress=false",
        "train.tensorboard=false", "train.device=cpu", "train.precision=fp32", "train.eval_batches=1",
    ])


@pytest.fixture(autouse=True)
def no_fsync(monkeypatch):
    """Durability is not checked here; this process's fsyncs (shards, checkpoints) would cost most of its time."""
    monkeypatch.setattr(os, "fsync", lambda fd: None)


@pytest.mark.slow
def test_the_shrunk_wmt14_recipe_on_two_gloo_ranks_equals_one_process_accumulating(tmp_path):
    src, tgt = write_parallel(tmp_path / "text", n=120)
    prepared = tmp_path / "prepared"
    prepare(prepared, {"train": (src, tgt), "val": (src, tgt)}, PrepareSettings(vocab_size=300, shard_lines=50))
    config = shrunk_recipe(tmp_path / "ddp", prepared)
    assert config.train.micro_batches_per_step == 8  # the recipe's: 4 a rank on 2 ranks, 8 on one process

    # The ranks' shares of an epoch: disjoint, from the shards' index alone.
    shares = [{i for batch in build_task_data(config.data, seed=0, rank=r, world_size=2).train.epoch_batches(0) for i in batch}
              for r in (0, 1)]
    assert shares[0] and shares[1] and not shares[0] & shares[1]

    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           "-m", "aiayn", "train", str(save_config(config, tmp_path / "ddp.yaml"))]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]

    single = train(shrunk_recipe(tmp_path / "one", prepared))
    losses = {r["step"]: r["loss"] for r in read_metrics(tmp_path / "ddp") if "loss" in r}
    single_losses = {r["step"]: r["loss"] for r in read_metrics(single.run_dir) if "loss" in r}
    assert sorted(losses) == sorted(single_losses) == list(range(1, STEPS + 1))
    for step, loss in single_losses.items():
        assert losses[step] == pytest.approx(loss, abs=1e-5)
    weights, _ = read_safetensors(tmp_path / "ddp" / f"step-{STEPS:06d}" / "model.safetensors")
    for name, tensor in single.model.state_dict().items():
        if name.endswith("w_k.bias"):  # true gradient 0: Adam amplifies rounding noise (see test_loop.py)
            continue
        torch.testing.assert_close(weights[name], tensor, atol=1e-5, rtol=1e-5, msg=name)


def test_the_recipe_checkpoints_by_time_and_splits_its_batch_over_the_ranks(tmp_path):
    """train.save_every_minutes saves when the time has passed (here at once: every step), whatever save_every says;
    train.micro_batches_per_step is divided among the ranks, or refused when it cannot be."""
    from loop_fixtures import translation_config

    from aiayn.checkpoint.state import list_checkpoints

    config = translation_config(tmp_path, steps=3, save_every=100, save_every_minutes=1e-9, eval_every=100)
    train(config)
    assert [p.name for p in list_checkpoints(tmp_path / "run")] == ["step-000001", "step-000002", "step-000003"]
    loop = apply_overrides(load_yaml(recipe_path("wmt14-en-de-big"), TrainConfig), []).train
    assert [loop.micro_batches(n) for n in (1, 2, 8)] == [8, 4, 1]
    with pytest.raises(ValueError, match="train.micro_batches_per_step=8 is not a multiple of the 16 ranks"):
        loop.micro_batches(16)
