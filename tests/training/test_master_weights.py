"""train.precision=bf16-master: bf16 copies of fp32 masters, cast once per step. It follows autocast's loss
curve, keeps the masters fp32 (and tied weights tied), resumes bit for bit, and auto picks it by a rule."""

from __future__ import annotations

import copy
import dataclasses
import logging
import os

import pytest
import torch
from loop_fixtures import lm_config, translation_config

from aiayn import build_model
from aiayn.allocator import ONEDNN_CACHE_ENV
from aiayn.checkpoint.weights import read_safetensors
from aiayn.data import LMBatch
from aiayn.inference import gemv, kernel_choice
from aiayn.training import precision as precision_module
from aiayn.training.activation_checkpointing import apply_activation_checkpointing
from aiayn.training.loop import train
from aiayn.training.master_weights import MasterWeights
from aiayn.training.metrics_log import read_metrics
from aiayn.training.objectives import Objective
from aiayn.training.optim import OptimConfig, build_optimizer
from aiayn.training.precision import MASTER, MASTER_MIN_PARAMS, autocast_context, resolve_precision
from aiayn.training.step import TrainStep

CPU = torch.device("cpu")
STEPS = 50
TOLERANCE = 0.01  # relative, at every step (measured: under 0.1%): bf16 rounding, not a drift


def _curve(precision: str, steps: int = STEPS, checkpointed: bool = False) -> list[float]:
    """``steps`` AdamW steps of a tiny decoder-only model on fixed random windows, in ``precision``."""
    torch.manual_seed(0)
    model = build_model("tiny-decoder-only", d_model=16, d_ff=32, n_heads=2, n_layers=1, vocab_size=24)
    if checkpointed:
        apply_activation_checkpointing(model)
    optimizer = build_optimizer(model, OptimConfig(name="adamw", lr=3e-3, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1))
    objective = Objective(model, "lm")
    g = torch.Generator().manual_seed(1)
    data = torch.randint(0, 24, (4, 8, 17), generator=g)  # 4 batches of 8 windows of 16 (+1)
    data[..., 1::2] = data[..., 0::2][..., :8]  # a learnable pattern: every odd token repeats the one before
    master = MasterWeights(model) if precision == MASTER else None
    step = TrainStep(
        objective, model, optimizer, grad_clip=1.0,
        autocast=autocast_context("float32" if master else precision, CPU), master=master,
    )
    losses = []
    for i in range(steps):
        batch = data[i % 4]
        result = step([LMBatch(input=batch[:, :-1], target=batch[:, 1:])], i + 1)
        assert result is not None
        losses.append(result.loss)
    assert all(p.dtype == torch.float32 for p in model.parameters())  # the masters stay fp32
    return losses


def test_master_weights_follow_autocasts_loss_curve():
    autocast, master = _curve("bfloat16"), _curve(MASTER)
    assert master[0] == pytest.approx(autocast[0], rel=1e-2)
    for k, (a, m) in enumerate(zip(autocast, master)):
        assert abs(m - a) <= TOLERANCE * a, f"step {k + 1}: bf16-master {m:.4f} vs autocast {a:.4f}"
    assert master[-1] < master[0] - 0.5  # it learns (so the comparison is not of two flat lines)


def test_activation_checkpointing_recomputes_on_the_copies():
    """The backward runs while the copies are swapped in, so a recomputed block sees bf16 weights too."""
    assert _curve(MASTER, steps=3, checkpointed=True) == _curve(MASTER, steps=3)


def test_copies_follow_the_masters_and_tied_weights_stay_tied():
    model = build_model("tiny-encoder-decoder", d_model=16, d_ff=32, n_heads=2, vocab_size=30)
    tied = model.output.weight
    assert tied is model.src_embed.weight
    master = MasterWeights(model)
    seen = {}
    model.output.register_forward_pre_hook(lambda module, args: seen.update(dtype=module.weight.dtype))
    ids = torch.randint(4, 30, (2, 5))
    with master.swapped():
        logits = model(ids, ids)
    assert seen["dtype"] == torch.bfloat16 and logits.dtype == torch.bfloat16
    assert model.output.weight is tied and model.src_embed.weight is tied and model.tgt_embed.weight is tied
    logits.float().sum().backward()
    master.accumulate_grads()
    assert tied.grad is not None and tied.grad.dtype == torch.float32
    assert all(c.grad is None for c in master.copies.values())
    with torch.no_grad():
        tied.add_(1.0)
    master.update_copies()
    assert torch.equal(master.copies["src_embed.weight"], tied.detach().bfloat16())


def test_auto_rule_and_the_slow_cpu_warning(monkeypatch, caplog):
    monkeypatch.setattr(precision_module, "native_bf16", lambda device: True)
    assert resolve_precision("auto", CPU, n_params=MASTER_MIN_PARAMS, master_ok=True) == MASTER
    assert resolve_precision("auto", CPU, n_params=MASTER_MIN_PARAMS - 1, master_ok=True) == "bfloat16"
    assert resolve_precision("auto", CPU, n_params=MASTER_MIN_PARAMS, master_ok=False) == "bfloat16"
    assert resolve_precision("bf16-master", CPU) == MASTER
    monkeypatch.setattr(precision_module, "native_bf16", lambda device: False)
    assert resolve_precision("auto", CPU, n_params=MASTER_MIN_PARAMS, master_ok=True) == "float32"
    with caplog.at_level(logging.WARNING, logger="aiayn.training.precision"):
        assert resolve_precision("bf16-master", CPU) == MASTER
    assert "train.precision=bf16-master" in caplog.text and "slower" in caplog.text


def test_master_weights_refuse_compile_before_any_work(tmp_path):
    config = lm_config(tmp_path, steps=2)
    config = dataclasses.replace(config, train=dataclasses.replace(config.train, precision="bf16-master", compile=True))
    with pytest.raises(ValueError, match=r"train\.precision=bf16-master.*train\.compile"):
        train(config)
    assert not (tmp_path / "run").exists()


def test_resume_is_bit_for_bit_with_every_new_option_on(tmp_path, monkeypatch):
    """bf16-master, batch lengths padded to a multiple of 8, the chunked cross-entropy (always on), oneDNN's primitive
    cache bounded, dropout on (by our kernel where it builds): 6 steps straight == 3 steps, stop, resume to 6 (losses
    and saved weights, bit for bit)."""
    monkeypatch.setenv(ONEDNN_CACHE_ENV, "")
    monkeypatch.delenv(ONEDNN_CACHE_ENV)  # unset now, and unset again after the test (training sets it)
    seeds: list[int] = []
    if gemv.available():
        monkeypatch.setenv(kernel_choice.DROPOUT_ENV_VAR, "native")
        monkeypatch.setattr(kernel_choice, "_NATIVE_CHOSEN", {})
        kernel = gemv.dropout
        monkeypatch.setattr(gemv, "dropout", lambda x, p, seed: seeds.append(seed) or kernel(x, p, seed))

    def config(name: str, **loop: object):
        c = translation_config(tmp_path / name, steps=6, save_every=3, eval_every=6, precision="bf16-master",
                               onednn_cache_capacity=16, **loop)
        return dataclasses.replace(c, data=dataclasses.replace(c.data, pad_to_multiple=8))

    straight = train(config("a"))
    train(config("b", stop_after=3))
    resumed = train(config("b"))
    assert resumed.step == 6 and os.environ[ONEDNN_CACHE_ENV] == "16"  # what oneDNN reads at its first primitive
    losses = [{r["step"]: r["loss"] for r in read_metrics(run.run_dir) if "loss" in r} for run in (straight, resumed)]
    assert all(r["peak_rss_mb"] > 0 for r in read_metrics(straight.run_dir) if "loss" in r)  # logged with the loss
    assert sorted(losses[0]) == list(range(1, 7)) and losses[0] == losses[1]
    a, _ = read_safetensors(straight.run_dir / "step-000006" / "model.safetensors")
    b, _ = read_safetensors(resumed.run_dir / "step-000006" / "model.safetensors")
    assert a.keys() == b.keys() and all(a[k].dtype == torch.float32 and torch.equal(a[k], b[k]) for k in a)
    assert not gemv.available() or len(seeds) > 0


def _step_runner(model: torch.nn.Module, batch: torch.Tensor):
    objective = Objective(model, "lm")
    return lambda micro: objective(micro), [LMBatch(input=batch[:, :-1], target=batch[:, 1:])]


@pytest.mark.parametrize("name", ["adamw", "adam"])
@pytest.mark.parametrize("micro_batches", [1, 2])  # the copies' bf16 gradients, or their fp32 sum
def test_the_one_pass_step_equals_torchs_optimizer(native_gemv, name, micro_batches):
    """MasterWeights.step (aiayn/inference/adamw.cpp) against the step it replaces (the bf16 gradients widened into the
    masters, torch's fused optimizer, the masters cast into the copies), clipped, 8 steps each from the same state: the
    same masters and moments to fp32 rounding, the copies exactly the masters rounded to bf16, torch's state kept in
    torch's form."""
    torch.manual_seed(0)
    models = [build_model("tiny-decoder-only", d_model=16, d_ff=32, n_heads=2, n_layers=1, vocab_size=24) for _ in range(2)]
    config = OptimConfig(name=name, lr=3e-3, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1)
    steps = [TrainStep(Objective(m, "lm"), m, build_optimizer(m, config), grad_clip=0.5, master=MasterWeights(m)) for m in models]
    steps[1].fused = False  # the four passes through torch's optimizer
    assert steps[0].fused and steps[0].master.fused_blocker(steps[0].optimizer) is None
    data = torch.randint(0, 24, (8, 2 * micro_batches, 9), generator=torch.Generator().manual_seed(3))
    for i, batch in enumerate(data):
        models[1].load_state_dict(models[0].state_dict())  # the same state before each step
        steps[1].optimizer.load_state_dict(copy.deepcopy(steps[0].optimizer.state_dict()))  # load_state_dict keeps a same-dtype tensor
        steps[1].master.update_copies()
        micro = [LMBatch(input=b[:, :-1], target=b[:, 1:]) for b in batch.chunk(micro_batches)]
        results = [step(micro, i + 1) for step in steps]
        assert results[0].grad_norm == pytest.approx(results[1].grad_norm, rel=1e-5)
        for (key, a), b in zip(models[0].named_parameters(), models[1].parameters()):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-8, msg=f"step {i + 1}: {key}")
            assert torch.equal(steps[0].master.copies[key], a.detach().bfloat16())
            assert a.grad is None and steps[0].master.copies[key].grad is None
        states = [s.optimizer.state_dict()["state"] for s in steps]
        assert states[0].keys() == states[1].keys()
        for k in states[0]:
            assert states[0][k]["step"].dtype == states[1][k]["step"].dtype and float(states[0][k]["step"]) == i + 1
            torch.testing.assert_close(states[0][k]["exp_avg"], states[1][k]["exp_avg"], rtol=1e-6, atol=1e-9)
            torch.testing.assert_close(states[0][k]["exp_avg_sq"], states[1][k]["exp_avg_sq"], rtol=1e-6, atol=1e-12)


def test_the_one_pass_step_is_kept_to_what_it_does(native_gemv):
    model = build_model("tiny-decoder-only", d_model=16, d_ff=32, n_heads=2, n_layers=1, vocab_size=24)
    master = MasterWeights(model)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    assert master.fused_blocker(sgd) == "a SGD (torch's Adam and AdamW only)"
    assert master.fused_blocker(torch.optim.AdamW(model.parameters(), amsgrad=True)) == "amsgrad=True"
    assert not TrainStep(Objective(model, "lm"), model, sgd, master=master).fused


def test_norm_of_all_against_float64(native_gemv):
    g = torch.Generator().manual_seed(0)
    tensors = [torch.randn(n, generator=g) for n in (1, 17, 65_536, 65_537 + 100)]  # off the vector width and the block
    want = torch.cat([t.double() for t in tensors]).norm().item()
    assert torch.ops.aiayn_native.norm_of_all(tensors) == pytest.approx(want, rel=1e-5)  # fp32 sums of 2^16 squares
    halves = [t.bfloat16() for t in tensors]
    want = torch.cat([t.double() for t in halves]).norm().item()
    assert torch.ops.aiayn_native.norm_of_all(halves) == pytest.approx(want, rel=1e-5)
    with pytest.raises(RuntimeError, match="tensor 0 must be a contiguous float32 or bfloat16"):
        torch.ops.aiayn_native.norm_of_all([torch.ones(4, dtype=torch.float64)])


def test_the_one_pass_step_counts_as_the_optimizers_step(native_gemv, recwarn):
    """A learning-rate scheduler stepped after it sees an optimizer step (no "lr_scheduler.step() before
    optimizer.step()" warning), and the schedule's rate is the one the pass used."""
    model = build_model("tiny-decoder-only", d_model=16, d_ff=32, n_heads=2, n_layers=1, vocab_size=24)
    optimizer = build_optimizer(model, OptimConfig(name="adamw", lr=1e-3, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 0.5 ** s)
    step = TrainStep(Objective(model, "lm"), model, optimizer, scheduler=scheduler, grad_clip=1.0, master=MasterWeights(model))
    batch = torch.randint(0, 24, (2, 9), generator=torch.Generator().manual_seed(0))
    for i in range(3):
        assert step([LMBatch(input=batch[:, :-1], target=batch[:, 1:])], i + 1) is not None
    assert step.fused and not [w for w in recwarn if "lr_scheduler" in str(w.message)]
    assert optimizer.param_groups[0]["lr"] == pytest.approx(1e-3 * 0.5**3)


def test_the_one_pass_kernel_refuses_what_it_cannot_step(native_gemv):
    p, m, v = torch.zeros(8), torch.zeros(8), torch.zeros(8)
    step = torch.ops.aiayn_native.adamw_step
    with pytest.raises(RuntimeError, match="parameter 0 must be a contiguous float32"):
        step([p.double()], [p], [m], [v], [], 1e-3, 0.9, 0.99, 0.0, 1e-8, 1.0, 1.0, True)
    with pytest.raises(RuntimeError, match="exp_avg 0 must be a contiguous Float CPU tensor of 8 elements"):
        step([p], [p], [torch.zeros(7)], [v], [], 1e-3, 0.9, 0.99, 0.0, 1e-8, 1.0, 1.0, True)
    with pytest.raises(RuntimeError, match="1 parameters take as many gradients"):
        step([p], [], [m], [v], [], 1e-3, 0.9, 0.99, 0.0, 1e-8, 1.0, 1.0, True)
    with pytest.raises(RuntimeError, match="step >= 1"):
        step([p], [p], [m], [v], [], 1e-3, 0.9, 0.99, 0.0, 1e-8, 0.0, 1.0, True)
