"""optim: schedules (Noam, cosine, constant), configs, weight-decay split, optimizer and scheduler."""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch
from torch import nn
from training_helpers import TinyModel

from aiayn.nn.embedding import TokenEmbedding
from aiayn.nn.positional import LearnedPositions
from aiayn.training.optim import (
    OptimConfig,
    ScheduleConfig,
    build_optimizer,
    build_scheduler,
    constant_lr,
    cosine_lr,
    noam_lr,
    weight_decay_split,
)


def test_noam_matches_the_paper_at_known_steps() -> None:
    # 512^-0.5 * min(step^-0.5, step * 4000^-1.5), values computed by hand
    assert math.isclose(noam_lr(1, 512, 4000), 1.7469281074217108e-07, rel_tol=1e-14)
    assert math.isclose(noam_lr(4000, 512, 4000), 0.0006987712429686843, rel_tol=1e-14)  # the peak
    assert math.isclose(noam_lr(16000, 512, 4000), 0.00034938562148434214, rel_tol=1e-14)
    assert math.isclose(noam_lr(100, 512, 4000) / noam_lr(50, 512, 4000), 2.0, rel_tol=1e-14)  # linear warmup
    assert math.isclose(noam_lr(4000, 512, 4000, factor=2.0), 2 * 0.0006987712429686843, rel_tol=1e-14)
    assert max(range(1, 10000), key=lambda s: noam_lr(s, 512, 4000)) == 4000


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((0, 512, 4000), r"step=0 must be an int >= 1"),
        ((1, 0, 4000), r"d_model=0 must be an int >= 1"),
        ((1, 512, 0), r"warmup=0 must be an int >= 1"),
    ],
)
def test_noam_rejects_bad_arguments(args: tuple[int, int, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        noam_lr(*args)


def _nanogpt_get_lr(it: int, learning_rate: float, min_lr: float, warmup_iters: int, lr_decay_iters: int) -> float:
    """nanoGPT's train.py get_lr, copied."""
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if it > lr_decay_iters:
        return min_lr
    decay_ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))
    return min_lr + coeff * (learning_rate - min_lr)


def test_cosine_matches_nanogpt_and_its_landmarks() -> None:
    got = [cosine_lr(s, max_lr=6e-4, min_lr=6e-5, warmup=10, max_steps=50) for s in range(60)]
    assert got == [_nanogpt_get_lr(s, 6e-4, 6e-5, 10, 50) for s in range(60)]
    assert got[0] == 6e-4 / 11 and got[10] == 6e-4 and got[50] == 6e-5 and got[59] == 6e-5
    assert math.isclose(got[30], (6e-4 + 6e-5) / 2, rel_tol=1e-12)
    assert all(a >= b for a, b in zip(got[10:], got[11:]))


def test_cosine_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match=r"max_steps must be > warmup \(10\), got 10"):
        cosine_lr(0, max_lr=1.0, min_lr=0.0, warmup=10, max_steps=10)
    with pytest.raises(ValueError, match=r"need 0 <= min_lr <= max_lr, got min_lr=2.0, max_lr=1.0"):
        cosine_lr(0, max_lr=1.0, min_lr=2.0, warmup=0, max_steps=10)
    with pytest.raises(ValueError, match=r"step=-1 must be an int >= 0"):
        cosine_lr(-1, max_lr=1.0, min_lr=0.0, warmup=0, max_steps=10)


def test_constant_with_and_without_warmup() -> None:
    assert [constant_lr(s, lr=0.5) for s in range(3)] == [0.5, 0.5, 0.5]
    assert [constant_lr(s, lr=0.5, warmup=3) for s in range(5)] == [0.125, 0.25, 0.375, 0.5, 0.5]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": "linear"}, r"name='linear' must be one of \('constant', 'cosine', 'noam'\)"),
        ({"warmup": -1}, r"warmup=-1 must be an int >= 0"),
        ({"warmup": 0}, r"warmup must be >= 1 for the noam schedule, got 0"),
        ({"d_model": 0}, r"d_model=0 must be an int >= 1"),
        ({"factor": 0.0}, r"factor=0.0 must be a finite number > 0.0"),
        ({"name": "cosine", "max_steps": 5000, "min_lr_ratio": 1.5}, r"min_lr_ratio=1.5 must be <= 1"),
        ({"min_lr_ratio": -0.1}, r"min_lr_ratio=-0.1 must be a finite number >= 0.0"),
        ({"max_steps": 0}, r"max_steps=0 must be an int >= 1"),
    ],
)
def test_schedule_config_validation(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ScheduleConfig(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": "sgd"}, r"name='sgd' must be one of \('adam', 'adamw', 'muon'\)"),
        ({"lr": 0.0}, r"lr=0.0 must be a finite number > 0.0"),
        ({"lr": float("nan")}, r"lr=nan must be a finite number > 0.0"),
        ({"betas": (0.9, 1.0)}, r"betas must be a tuple of two numbers in \[0, 1\), got \(0.9, 1.0\)"),
        ({"betas": (0.9, 0.98, 0.9)}, r"betas must be a tuple of two numbers"),
        ({"betas": [0.9, 0.98]}, r"betas must be a tuple of two numbers in \[0, 1\), got \[0.9, 0.98\]"),
        ({"eps": 0.0}, r"eps=0.0 must be a finite number > 0.0"),
        ({"weight_decay": -0.1}, r"weight_decay=-0.1 must be a finite number >= 0.0"),
    ],
)
def test_optim_config_validation(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        OptimConfig(**kwargs)


def test_paper_defaults() -> None:
    assert OptimConfig() == OptimConfig(name="adam", lr=1.0, betas=(0.9, 0.98), eps=1e-9, weight_decay=0.0)
    assert ScheduleConfig() == ScheduleConfig(name="noam", warmup=4000, d_model=None, factor=1.0)
    assert ScheduleConfig().resolve(max_steps=100_000, d_model=512).d_model == 512  # base model: d_model from the model


def test_weight_decay_split_by_module_type_and_shape() -> None:
    decay, no_decay = weight_decay_split(TinyModel(tied=True))
    assert decay == ["proj.weight"]  # the output projection is the (tied) embedding
    assert no_decay == ["embed.weight", "proj.bias", "norm.weight", "norm.bias"]
    decay, no_decay = weight_decay_split(TinyModel(tied=False))
    assert decay == ["proj.weight", "out.weight"]
    assert no_decay == ["embed.weight", "proj.bias", "norm.weight", "norm.bias"]


def test_weight_decay_split_rmsnorm_frozen_and_custom_types() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.RMSNorm(4), nn.Linear(4, 2))
    model[2].weight.requires_grad_(False)
    assert weight_decay_split(model) == (["0.weight"], ["0.bias", "1.weight", "2.bias"])
    assert weight_decay_split(model, no_decay_modules=(nn.Linear,)) == ([], ["0.weight", "0.bias", "1.weight", "2.bias"])


class _LibraryEmbeddings(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = TokenEmbedding(10, 4)
        self.positions = LearnedPositions(4, max_len=6)
        self.proj = nn.Linear(4, 10, bias=False)
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight  # tied like the library's output projection


def test_library_embeddings_are_not_decayed() -> None:
    assert weight_decay_split(_LibraryEmbeddings()) == (["proj.weight"], ["embed.weight", "positions.weight"])


def test_build_optimizer_groups_names_and_fused_kernel() -> None:
    model = TinyModel(tied=False)
    opt = build_optimizer(model, OptimConfig(name="adamw", lr=3e-4, weight_decay=0.1))
    assert type(opt) is torch.optim.AdamW
    decay, no_decay = weight_decay_split(model)
    assert [g["param_names"] for g in opt.param_groups] == [decay, no_decay]
    assert [g["weight_decay"] for g in opt.param_groups] == [0.1, 0.0]
    params = dict(model.named_parameters())
    assert all(p is params[n] for g in opt.param_groups for p, n in zip(g["params"], g["param_names"]))
    assert all(g["fused"] is True and g["betas"] == (0.9, 0.98) and g["eps"] == 1e-9 and g["lr"] == 3e-4 for g in opt.param_groups)
    opt2 = build_optimizer(model, OptimConfig(name="adam", lr=1.0))
    assert type(opt2) is torch.optim.Adam and [g["weight_decay"] for g in opt2.param_groups] == [0.0, 0.0]


def test_build_optimizer_errors() -> None:
    frozen = nn.Linear(2, 2).requires_grad_(False)
    with pytest.raises(ValueError, match="model Linear has no trainable parameters"):
        build_optimizer(frozen, OptimConfig(name="adam", lr=1.0))
    with pytest.raises(ValueError, match=r"name='sgd' must be one of \('adam', 'adamw', 'muon'\)"):
        build_optimizer(nn.Linear(2, 2), OptimConfig(name="sgd", lr=1.0))  # type: ignore[arg-type]


def test_fused_steps_match_plain_torch_with_the_same_groups() -> None:
    torch.manual_seed(0)
    model = TinyModel(tied=False).double()
    reference = copy.deepcopy(model)
    opt = build_optimizer(model, OptimConfig(name="adamw", lr=1e-2, weight_decay=0.5))
    ref_params = dict(reference.named_parameters())
    decay, no_decay = weight_decay_split(reference)
    ref_opt = torch.optim.AdamW(
        [{"params": [ref_params[n] for n in decay], "weight_decay": 0.5}, {"params": [ref_params[n] for n in no_decay], "weight_decay": 0.0}],
        lr=1e-2, betas=(0.9, 0.98), eps=1e-9, foreach=False, fused=False,
    )  # fmt: skip
    ids = torch.randint(0, 11, (3, 5))
    for _ in range(3):
        for m, o in ((model.eval(), opt), (reference.eval(), ref_opt)):
            o.zero_grad()
            m(ids).square().mean().backward()
            o.step()
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        assert torch.allclose(p, q, rtol=1e-12, atol=1e-14), name


def _lrs(opt: torch.optim.Optimizer) -> list[float]:
    return [g["lr"] for g in opt.param_groups]


def test_noam_scheduler_gives_the_paper_rate_with_lr_one() -> None:
    opt = build_optimizer(TinyModel(), OptimConfig(name="adam", lr=1.0))
    sched = build_scheduler(opt, ScheduleConfig(name="noam", warmup=4, d_model=16))
    seen = []
    for _ in range(8):
        seen.append(_lrs(opt))
        opt.step()
        sched.step()
    assert seen == [[noam_lr(s, 16, 4)] * 2 for s in range(1, 9)]


def test_cosine_scheduler_scales_the_optimizer_lr() -> None:
    opt = build_optimizer(TinyModel(), OptimConfig(name="adamw", lr=6e-4))
    sched = build_scheduler(opt, ScheduleConfig(name="cosine", warmup=3, max_steps=10, min_lr_ratio=0.1))
    for step in range(12):
        expected = _nanogpt_get_lr(step, 6e-4, 6e-5, 3, 10)
        assert all(math.isclose(lr, expected, rel_tol=1e-12) for lr in _lrs(opt)), step
        opt.step()
        sched.step()


def test_scheduler_state_is_json_and_resumes_exactly() -> None:
    cfg = ScheduleConfig(name="cosine", warmup=2, max_steps=20)
    opt = build_optimizer(TinyModel(), OptimConfig(name="adam", lr=1e-3))
    sched = build_scheduler(opt, cfg)
    for _ in range(5):
        opt.step()
        sched.step()
    state = json.loads(json.dumps(sched.state_dict()))
    opt2 = build_optimizer(TinyModel(), OptimConfig(name="adam", lr=1e-3))
    sched2 = build_scheduler(opt2, cfg)
    opt2.load_state_dict(opt.state_dict())
    sched2.load_state_dict(state)
    for _ in range(5):
        opt.step()
        sched.step()
        opt2.step()
        sched2.step()
        assert _lrs(opt) == _lrs(opt2)


def test_build_scheduler_wants_a_schedule_config() -> None:
    opt = build_optimizer(TinyModel(), OptimConfig(name="adam", lr=1.0))
    with pytest.raises(TypeError, match="cfg must be a ScheduleConfig, got dict"):
        build_scheduler(opt, {"name": "noam"})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"d_model": None}, r"d_model is required by the noam schedule, got None"),
        ({"name": "cosine", "warmup": 10}, r"max_steps must be an int > warmup \(10\) for the cosine schedule, got None"),
        ({"name": "cosine", "warmup": 10, "max_steps": 10}, r"got 10"),
    ],
)
def test_an_unresolved_schedule_is_refused_when_built(kwargs: dict, message: str) -> None:
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    with pytest.raises(ValueError, match=message):
        build_scheduler(opt, ScheduleConfig(**kwargs))


def test_resolve_follows_the_run_and_the_model_unless_set() -> None:
    cfg = ScheduleConfig(name="cosine", warmup=2)
    assert cfg.resolve(max_steps=50, d_model=64) == ScheduleConfig(name="cosine", warmup=2, max_steps=50, d_model=64)
    explicit = ScheduleConfig(name="noam", warmup=2, d_model=32, max_steps=7)
    assert explicit.resolve(max_steps=50, d_model=64) == explicit


@pytest.mark.parametrize(
    ("cfg", "steps", "warmup"),
    [
        (ScheduleConfig(name="cosine", warmup=100), 10, 9),  # --set train.max_steps=10 on the Shakespeare recipe
        (ScheduleConfig(name="cosine", warmup=100, max_steps=60), 2000, 59),  # --set schedule.max_steps=60
        (ScheduleConfig(name="noam", warmup=400), 60, 60),
        (ScheduleConfig(name="constant", warmup=5), 3, 3),
    ],
)
def test_a_warmup_longer_than_the_run_is_capped_with_a_warning(cfg, steps, warmup, caplog) -> None:
    with caplog.at_level("WARNING", logger="aiayn.training.optim"):
        resolved = cfg.resolve(max_steps=steps, d_model=64)
    assert resolved.warmup == warmup
    assert f"schedule.warmup={cfg.warmup} is longer than" in caplog.text
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    build_scheduler(opt, resolved)  # a complete, valid schedule
