"""Optimizer and learning-rate schedules: Adam/AdamW with a clear weight-decay rule, Noam and cosine.

The paper (section 5.3) trains with Adam, betas (0.9, 0.98), eps 1e-9 and
``lr = d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)`` (warmup 4000). Schedules here are
multipliers of the optimizer's ``lr`` driven by ``torch.optim.lr_scheduler.LambdaLR``, so a
scheduler's state_dict is plain data; with the Noam schedule, ``lr = 1.0`` gives the paper's rate
exactly (the Annotated Transformer's convention).

Steps: ``LambdaLR`` calls its function with 0 for the first update; the paper counts from 1.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Iterable
from typing import Literal

import torch
from torch import nn

from aiayn.nn.embedding import TokenEmbedding
from aiayn.nn.positional import LearnedPositions
from aiayn.validation import check_choice, check_int, check_number, is_number, rule

__all__ = [
    "OptimConfig",
    "ScheduleConfig",
    "NO_DECAY_MODULES",
    "noam_lr",
    "cosine_lr",
    "constant_lr",
    "lr_multiplier",
    "weight_decay_split",
    "build_optimizer",
    "build_scheduler",
]

log = logging.getLogger(__name__)
OPTIMIZERS = ("adam", "adamw", "muon")  # muon: Muon for the blocks' matrices + AdamW for the rest
SCHEDULES = ("constant", "cosine", "noam")
# Parameters of these modules are never decayed: shrinking norm gains or embeddings towards 0 has
# no regularising meaning. Biases and other vectors (ndim < 2) are excluded by shape. The library's
# own embeddings hold a plain (vocab, d_model) Parameter, so they are named here too.
NO_DECAY_MODULES: tuple[type[nn.Module], ...] = (
    nn.LayerNorm,
    nn.RMSNorm,
    nn.Embedding,
    TokenEmbedding,
    LearnedPositions,
)


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    """Optimizer settings; the defaults are the paper's (section 5.3), lr 1.0 times the Noam schedule.

    ``weight_decay`` is decoupled for ``adamw`` and an L2 term in the gradient for ``adam``; it never
    applies to norms, biases and embeddings (see ``weight_decay_split``).
    """

    name: Literal["adam", "adamw", "muon"] = "adam"
    lr: float = 1.0
    betas: tuple[float, float] = (0.9, 0.98)
    eps: float = 1e-9
    weight_decay: float = 0.0
    muon_lr: float = 0.02  # name=muon: the blocks' matrices (lr, betas, eps apply to the AdamW rest)
    muon_momentum: float = 0.95

    def __post_init__(self) -> None:
        check_choice("name", self.name, OPTIMIZERS)
        check_number("lr", self.lr, minimum=0.0, inclusive=False)
        if not (
            isinstance(self.betas, tuple)
            and len(self.betas) == 2
            and all(is_number(b) and 0.0 <= b < 1.0 for b in self.betas)
        ):
            raise ValueError(f"betas must be a tuple of two numbers in [0, 1), got {self.betas!r}")
        check_number("eps", self.eps, minimum=0.0, inclusive=False)
        check_number("weight_decay", self.weight_decay, minimum=0.0, inclusive=True)
        check_number("muon_lr", self.muon_lr, minimum=0.0, inclusive=False)
        if not (is_number(self.muon_momentum) and 0.0 <= self.muon_momentum < 1.0):
            raise ValueError(f"muon_momentum must be a number in [0, 1), got {self.muon_momentum!r}")


@dataclasses.dataclass(frozen=True)
class ScheduleConfig:
    """Learning-rate schedule: a multiplier of the optimizer's lr (default: the paper's Noam).

    ``noam`` uses ``d_model``, ``warmup`` (>= 1) and ``factor``; ``cosine`` warms up linearly for
    ``warmup`` steps then decays to ``min_lr_ratio`` at ``max_steps``; ``constant`` warms up linearly
    for ``warmup`` steps (0: none) then stays at 1. ``d_model`` and ``max_steps`` left unset (None)
    follow the model and the run (:meth:`resolve`), so shortening a run shortens its schedule.
    """

    name: Literal["constant", "cosine", "noam"] = "noam"
    warmup: int = 4000
    d_model: int | None = None  # None: the model's d_model
    factor: float = 1.0
    max_steps: int | None = None  # None: the run's train.max_steps
    min_lr_ratio: float = 0.1

    def __post_init__(self) -> None:
        check_choice("name", self.name, SCHEDULES)
        check_int("warmup", self.warmup, minimum=0)
        if self.d_model is not None:
            check_int("d_model", self.d_model, minimum=1)
        check_number("factor", self.factor, minimum=0.0, inclusive=False)
        if self.max_steps is not None:
            check_int("max_steps", self.max_steps, minimum=1)
        check_number("min_lr_ratio", self.min_lr_ratio, minimum=0.0, inclusive=True)
        if self.min_lr_ratio > 1.0:
            rule(False, "min_lr_ratio", self.min_lr_ratio, "must be <= 1")
        if self.name == "noam" and self.warmup < 1:
            raise ValueError(f"warmup must be >= 1 for the noam schedule, got {self.warmup}")

    def resolve(self, *, max_steps: int, d_model: int) -> ScheduleConfig:
        """This schedule for a run of ``max_steps`` steps on a model of width ``d_model``: unset fields
        take those values, and a warmup that does not end before the last step is capped, with a warning
        (else a short run would end still warming up)."""
        steps = self.max_steps if self.max_steps is not None else max_steps
        resolved = dataclasses.replace(self, max_steps=steps, d_model=self.d_model if self.d_model is not None else d_model)
        longest = steps - 1 if self.name == "cosine" else steps  # cosine needs at least one decay step
        if self.warmup > longest:
            log.warning("schedule.warmup=%d is longer than the %d steps of the schedule: capped at %d",
                        self.warmup, steps, max(longest, 1 if self.name == "noam" else 0))
            resolved = dataclasses.replace(resolved, warmup=max(longest, 1 if self.name == "noam" else 0))
        return resolved

    def check_complete(self) -> None:
        """Raise ``ValueError`` unless every value this schedule needs is set (see :meth:`resolve`)."""
        if self.name == "noam" and self.d_model is None:
            raise ValueError("d_model is required by the noam schedule, got None (resolve() fills it from the model)")
        if self.name == "cosine" and (self.max_steps is None or self.max_steps <= self.warmup):
            raise ValueError(
                f"max_steps must be an int > warmup ({self.warmup}) for the cosine schedule, got {self.max_steps!r}"
            )


# --------------------------------------------------------------------------- schedules


def noam_lr(step: int, d_model: int, warmup: int, factor: float = 1.0) -> float:
    """The paper's rate (section 5.3) at ``step`` (counted from 1): linear warmup, then ``step^-0.5`` decay."""
    check_int("step", step, minimum=1)
    check_int("d_model", d_model, minimum=1)
    check_int("warmup", warmup, minimum=1)
    return factor * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


def cosine_lr(step: int, *, max_lr: float, min_lr: float, warmup: int, max_steps: int) -> float:
    """nanoGPT's ``get_lr`` at ``step`` (from 0): linear warmup to ``max_lr``, cosine decay to ``min_lr``."""
    check_int("step", step, minimum=0)
    check_int("warmup", warmup, minimum=0)
    if max_steps <= warmup:
        raise ValueError(f"max_steps must be > warmup ({warmup}), got {max_steps}")
    if not 0.0 <= min_lr <= max_lr:
        raise ValueError(f"need 0 <= min_lr <= max_lr, got min_lr={min_lr}, max_lr={max_lr}")
    if step < warmup:
        return max_lr * (step + 1) / (warmup + 1)
    if step > max_steps:
        return min_lr
    decay_ratio = (step - warmup) / (max_steps - warmup)
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))  # 1 -> 0
    return min_lr + coeff * (max_lr - min_lr)


def constant_lr(step: int, *, lr: float, warmup: int = 0) -> float:
    """``lr`` after a linear warmup of ``warmup`` steps (``step`` from 0), with the ramp of ``cosine_lr``."""
    check_int("step", step, minimum=0)
    check_int("warmup", warmup, minimum=0)
    return lr * (step + 1) / (warmup + 1) if step < warmup else lr


def lr_multiplier(cfg: ScheduleConfig) -> Callable[[int], float]:
    """The function of ``LambdaLR``'s epoch (0 for the first update) that ``cfg`` describes."""
    cfg.check_complete()
    if cfg.name == "noam":
        d_model = cfg.d_model if cfg.d_model is not None else 0  # validated non-None by ScheduleConfig

        def noam(epoch: int) -> float:
            return noam_lr(epoch + 1, d_model, cfg.warmup, cfg.factor)

        return noam
    if cfg.name == "cosine":
        max_steps = cfg.max_steps if cfg.max_steps is not None else 0  # validated by ScheduleConfig

        def cosine(epoch: int) -> float:
            return cosine_lr(epoch, max_lr=1.0, min_lr=cfg.min_lr_ratio, warmup=cfg.warmup, max_steps=max_steps)

        return cosine

    def constant(epoch: int) -> float:
        return constant_lr(epoch, lr=1.0, warmup=cfg.warmup)

    return constant


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: ScheduleConfig) -> torch.optim.lr_scheduler.LambdaLR:
    """A ``LambdaLR`` following ``cfg``; call ``step()`` after each ``optimizer.step()``.

    Its ``state_dict`` is plain data (the multiplier is a plain function, stored as None), so it goes
    into a checkpoint's JSON; the schedule itself comes from the config on resume.
    """
    if not isinstance(cfg, ScheduleConfig):
        raise TypeError(f"cfg must be a ScheduleConfig, got {type(cfg).__name__}")
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda=lr_multiplier(cfg))


# --------------------------------------------------------------------------- optimizer


def weight_decay_split(
    model: nn.Module, no_decay_modules: tuple[type[nn.Module], ...] = NO_DECAY_MODULES
) -> tuple[list[str], list[str]]:
    """(names to decay, names not to decay) of ``model``'s trainable parameters.

    Not decayed: parameters of ``no_decay_modules`` (norms, embeddings; an output projection tied to
    an embedding counts as the embedding) and every parameter with ``ndim < 2`` (biases, gains).
    """
    exempt: set[int] = set()
    for module in model.modules():
        if isinstance(module, no_decay_modules):
            exempt.update(id(p) for p in module.parameters(recurse=False))
    decay: list[str] = []
    no_decay: list[str] = []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (no_decay if p.ndim < 2 or id(p) in exempt else decay).append(name)
    return decay, no_decay


def build_optimizer(
    model: nn.Module, cfg: OptimConfig, *, no_decay_modules: tuple[type[nn.Module], ...] = NO_DECAY_MODULES
) -> torch.optim.Optimizer:
    """Adam or AdamW (``cfg``) over ``model``'s trainable parameters, in two groups (decayed, not decayed);
    ``cfg.name="muon"``: Muon for the blocks' matrices and AdamW for the rest (``MuonWithAdamW``).

    Parameters are passed with their names (saved in the state_dict as ``param_names``). The fused
    kernel is used when torch has one for every parameter's device (CPU included); otherwise torch's
    default (foreach on CUDA). Raises ``TypeError`` unless ``cfg`` is an ``OptimConfig`` (validated
    when built), ``ValueError`` for a model without trainable parameters.
    """
    if not isinstance(cfg, OptimConfig):
        raise TypeError(f"cfg must be an OptimConfig, got {type(cfg).__name__}")
    if cfg.name == "muon":
        return _build_muon(model, cfg, no_decay_modules)
    params = dict(model.named_parameters())
    decay, no_decay = weight_decay_split(model, no_decay_modules)
    if not decay and not no_decay:
        raise ValueError(f"model {type(model).__name__} has no trainable parameters")
    groups = [
        {"params": [(n, params[n]) for n in names], "weight_decay": wd}
        for names, wd in ((decay, cfg.weight_decay), (no_decay, 0.0))
        if names
    ]
    fused = _fused_available(params[n] for n in decay + no_decay)
    optimizer_class = torch.optim.Adam if cfg.name == "adam" else torch.optim.AdamW
    return optimizer_class(groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, fused=True if fused else None)


def _build_muon(model: nn.Module, cfg: OptimConfig, no_decay_modules: tuple[type[nn.Module], ...]) -> torch.optim.Optimizer:
    from aiayn.training.muon import MuonWithAdamW, muon_split  # muon imports the blocks; keep optim light

    params = dict(model.named_parameters())
    matrices, rest = muon_split(model)
    _, no_decay = weight_decay_split(model, no_decay_modules)
    exempt = set(no_decay)
    groups = [
        {"params": [(n, params[n]) for n in names], "weight_decay": wd}
        for names, wd in (([n for n in rest if n not in exempt], cfg.weight_decay), ([n for n in rest if n in exempt], 0.0))
        if names
    ]
    fused = _fused_available(params[n] for n in rest)
    return MuonWithAdamW(
        [(n, params[n]) for n in matrices], groups, muon_lr=cfg.muon_lr, muon_momentum=cfg.muon_momentum,
        muon_weight_decay=cfg.weight_decay, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps,  # type: ignore[arg-type]
        fused=True if fused else None,
    )


def _fused_available(params: Iterable[torch.Tensor]) -> bool:
    try:  # torch has no public query for this; the optimizers use the same private list
        from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

        devices = set(_get_fused_kernels_supported_devices())
    except ImportError:
        devices = {"cuda"}
    return all(p.is_floating_point() and p.device.type in devices for p in params)
