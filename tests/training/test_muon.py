"""``optim.name: muon``: Muon for the blocks' matrices and AdamW for the rest, as one optimizer that learns and resumes exactly."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from loop_fixtures import lm_config
from torch import nn

from aiayn.models.presets import model_class, preset
from aiayn.training.loop import train
from aiayn.training.metrics_log import read_metrics
from aiayn.training.muon import MuonWithAdamW, muon_split
from aiayn.training.optim import OptimConfig, build_optimizer

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


def test_newton_schulz_is_torchs_iteration_and_fp32_steps_follow_torchs_muon():
    """Our Newton-Schulz in bf16 is torch's own bit for bit; in fp32 (chosen on CPUs without native bf16) one
    Muon step lands where torch's bf16 step does, within bf16's rounding, and orthogonalises the momentum."""
    from torch.optim._muon import DEFAULT_A, DEFAULT_B, DEFAULT_C, _zeropower_via_newtonschulz

    from aiayn.training.muon import Muon, newton_schulz

    torch.manual_seed(0)
    coefficients = (DEFAULT_A, DEFAULT_B, DEFAULT_C)
    for shape in [(24, 40), (40, 24)]:
        g = torch.randn(shape)
        assert torch.equal(newton_schulz(g, coefficients, 5, 1e-7, torch.bfloat16), _zeropower_via_newtonschulz(g, coefficients, 5, 1e-7))
        singular = torch.linalg.svdvals(newton_schulz(g, coefficients, 5, 1e-7, torch.float32))
        assert singular.min() > 0.5 and singular.max() < 1.5  # U S' V^T with S' near 1

    weights = [torch.randn(24, 40), torch.randn(40, 24)]
    ours = [nn.Parameter(w.clone()) for w in weights]
    theirs = [nn.Parameter(w.clone()) for w in weights]
    settings = {"lr": 0.02, "momentum": 0.95, "weight_decay": 0.01, "adjust_lr_fn": "original"}
    optimizers = [Muon(ours, ns_dtype=torch.float32, **settings), torch.optim.Muon(theirs, **settings)]
    for _ in range(3):
        grads = [torch.randn_like(w) for w in weights]
        for params, optimizer in zip((ours, theirs), optimizers):
            for p, g in zip(params, grads):
                p.grad = g.clone()
            optimizer.step()
    for a, b, w in zip(ours, theirs, weights):
        assert not torch.equal(a, w)
        torch.testing.assert_close(a, b, rtol=0, atol=3 * 0.02 * 1.5 * 2e-2)  # 3 steps of lr x shape factor x bf16 error
    assert set(optimizers[0].state_dict()["state"][0]) == {"momentum_buffer"}  # torch's state layout: checkpoints match


def test_muon_runs_newton_schulz_in_fp32_without_native_bf16(monkeypatch):
    import aiayn.training.muon as muon_module

    config = preset("tiny-decoder-only", vocab_size=30)
    model = model_class(config)(config)
    for native, expected in [(False, torch.float32), (True, torch.bfloat16)]:
        monkeypatch.setattr(muon_module, "native_bf16", lambda device, native=native: native)
        assert build_optimizer(model, MUON).muon.ns_dtype == expected
