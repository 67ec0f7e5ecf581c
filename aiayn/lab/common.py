"""What the experiments share: the result record, a minimal training loop and evaluation helpers.

The loop is deliberately tiny (Adam, a per-step learning rate, label-smoothed cross-entropy, the
library's one training step): each experiment must show one effect in minutes on a CPU, with
everything else held equal.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import torch
from torch import Tensor, nn
from tqdm import tqdm

from aiayn.tokenization.special import PAD_ID
from aiayn.training.objectives import seq2seq_loss, target_count
from aiayn.training.step import TrainStep

__all__ = ["LabResult", "TrainLog", "train", "token_accuracy", "held_out_nll", "Batch", "VERDICTS", "verdict_of"]

Batch = tuple[Tensor, Tensor, Tensor]  # src (B, S), tgt_in (B, T), tgt_out (B, T)
VERDICTS = ("confirmed", "partly confirmed", "not confirmed")


def verdict_of(checks: Iterable[bool]) -> str:
    """``confirmed`` when every check holds, ``not confirmed`` when none does, else ``partly confirmed``."""
    held = [bool(check) for check in checks]
    return VERDICTS[0] if all(held) else VERDICTS[1] if any(held) else VERDICTS[2]


@dataclass
class LabResult:
    """What an experiment found: the claim, a verdict and the numbers behind it."""

    name: str
    claim: str
    verdict: str  # one of VERDICTS
    summary: str  # the measured numbers in a few sentences
    numbers: dict[str, Any]
    plot: Path | None = None
    seconds: float = 0.0
    settings: dict[str, Any] = field(default_factory=dict)
    quick: bool = False  # tiny sizes: the verdict shows the code runs, it is no evidence for or against the claim

    def headline(self) -> str:
        """``lab NAME: VERDICT``; a quick run says that its verdict is not conclusive."""
        if self.quick:
            return f"lab {self.name} (QUICK RUN, NOT CONCLUSIVE; run without --quick for a verdict): {self.verdict} at tiny sizes"
        return f"lab {self.name}: {self.verdict.upper()}"

    def format(self) -> str:
        lines = [
            self.headline(),
            f"claim: {self.claim}",
            f"measured: {self.summary}",
            f"settings: {', '.join(f'{k}={v}' for k, v in self.settings.items())}",
            f"time: {self.seconds:.1f} s",
        ]
        if self.plot is not None:
            lines.append(f"plot: {self.plot}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "claim": self.claim, "verdict": self.verdict, "summary": self.summary,
            "numbers": self.numbers, "plot": str(self.plot) if self.plot else None, "seconds": self.seconds,
            "settings": self.settings, "quick": self.quick,
        }


@dataclass
class TrainLog:
    losses: list[float]
    diverged_at: int | None  # the step whose loss was not finite, if any
    seconds: float


def train(
    model: nn.Module,
    next_batch: Callable[[], Batch],
    *,
    steps: int,
    lr_at: Callable[[int], float],
    smoothing: float = 0.0,
    clip: float | None = None,
    desc: str = "training",
) -> TrainLog:
    """Train an encoder-decoder for ``steps`` Adam steps (betas 0.9/0.98, eps 1e-9, section 5.3)
    through the library's one training step (:class:`~aiayn.training.step.TrainStep`).

    ``lr_at(step)`` gives the learning rate of step ``1..steps``. Stops early at a non-finite loss or
    gradient. A tqdm bar (stderr) shows the steps.
    """
    optimizer = torch.optim.Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda epoch: lr_at(epoch + 1))  # lr = 1.0 * lr_at(step)
    step_once = TrainStep(lambda b: seq2seq_loss(model, b, smoothing), model, optimizer, scheduler=scheduler,
                          grad_clip=clip, count=target_count)
    model.train()
    losses: list[float] = []
    start = time.perf_counter()
    for step in tqdm(range(1, steps + 1), desc=desc, unit="step", leave=False, dynamic_ncols=True):
        try:
            result = step_once([next_batch()], step)
        except FloatingPointError:
            return TrainLog(losses, step, time.perf_counter() - start)
        assert result is not None  # nonfinite="raise" never skips
        losses.append(result.loss)
    return TrainLog(losses, None, time.perf_counter() - start)


@torch.no_grad()
def token_accuracy(model: nn.Module, batch: Batch, positions: slice | None = None) -> float:
    """Teacher-forced accuracy of the argmax over non-pad targets (optionally only at ``positions``)."""
    model.eval()
    src, tgt_in, tgt_out = batch
    pred = model(src, tgt_in).argmax(dim=-1)  # (B, T)
    keep = tgt_out != PAD_ID
    if positions is not None:
        sel = torch.zeros_like(keep)
        sel[:, positions] = True
        keep &= sel
    return float((pred == tgt_out)[keep].float().mean()) if bool(keep.any()) else math.nan


@torch.no_grad()
def held_out_nll(model: nn.Module, batch: Batch) -> float:
    """Mean negative log-likelihood per target token (no smoothing): ``exp`` of it is the perplexity."""
    model.eval()
    src, tgt_in, tgt_out = batch
    loss = seq2seq_loss(model, (src, tgt_in, tgt_out))
    return float(loss.sum / loss.count)


def tail_mean(values: list[float], fraction: float = 0.1) -> float:
    """Mean of the last ``fraction`` of ``values`` (at least one), NaN when empty."""
    if not values:
        return math.nan
    n = max(1, int(len(values) * fraction))
    return sum(values[-n:]) / n
