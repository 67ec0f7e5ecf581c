"""``optim.name: muon``: Muon for the blocks' matrices and AdamW for the rest, as one optimizer that learns and resumes exactly."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from aiayn.models.presets import model_class, preset
from aiayn.training.loop import train
from aiayn.training.metrics_log import read_metrics
from aiayn.training.muon import MuonWithAdamW, muon_split
from aiayn.training.optim import OptimConfig, build_optimizer
from loop_fixtures import lm_config

MUON = OptimConfig(name="muon", lr=3e-3, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.0, muon_lr=0.02)


def muon_config(tmp, **loop):
    return dataclasses.replace(lm_config(tmp, steps=20, eval_every=10, save_every=10, **loop), optim=MUON)


def test_muon_takes_the_blocks_matrices_and_adamw_the_rest():
    config = preset("tiny-decoder-only", vocab_size=30)
    model = model_class(config)(config)
    muon, rest = muon_split(model)
    params = dict(model.named_parameters())
    assert muon and all(params[n].ndim == 2 and n.startswith("decoder.layers.") for n in muon)
    tables = {"embed.weight", "positions.weight"}  # the token and (learned) position tables stay with AdamW
    assert tables <= set(rest) and all(params[n].ndim < 2 for n in rest if n not in tables)
    optimizer = build_optimizer(model, MUON)
    assert isinstance(optimizer.muon, torch.optim.Muon) and isinstance(optimizer.adamw, torch.optim.AdamW)
    groups = optimizer.param_groups
    assert [g["lr"] for g in groups] == [0.02, 3e-3]  # one schedule scales both base rates


def test_a_muon_run_lowers_the_loss_and_resumes_exactly(tmp_path):
    straight = train(muon_config(tmp_path / "a"))
    losses = {r["step"]: r["loss"] for r in read_metrics(straight.run_dir) if "loss" in r}
    assert sorted(losses) == list(range(1, 21))
    assert sum(list(losses.values())[-5:]) / 5 < losses[1] - 0.5

    half = muon_config(tmp_path / "b")
    train(dataclasses.replace(half, train=dataclasses.replace(half.train, stop_after=10)))
    resumed = train(half)  # resumes from step 10 (momentum buffers, AdamW moments, schedule, data position)
    resumed_losses = {r["step"]: r["loss"] for r in read_metrics(resumed.run_dir) if "loss" in r}
    assert resumed_losses == losses
    for name, tensor in straight.model.state_dict().items():
        assert torch.equal(tensor, resumed.model.state_dict()[name]), name


def test_muon_without_any_matrix_is_refused():
    with pytest.raises(ValueError, match="optim.name='muon' needs 2-D weight matrices in Transformer blocks"):
        build_optimizer(nn.Sequential(nn.Linear(3, 3), nn.LayerNorm(3)), MUON)
    with pytest.raises(ValueError, match="optim.name='muon' needs 2-D weight matrices"):
        MuonWithAdamW([], [], muon_lr=0.02, muon_momentum=0.95, muon_weight_decay=0.0, lr=1e-3, betas=(0.9, 0.99), eps=1e-8)


def test_muon_settings_are_validated():
    with pytest.raises(ValueError, match="muon_lr=.* must be a finite number > 0.0"):
        OptimConfig(name="muon", muon_lr=0.0)
    with pytest.raises(ValueError, match=r"muon_momentum must be a number in \[0, 1\)"):
        OptimConfig(name="muon", muon_momentum=1.0)
