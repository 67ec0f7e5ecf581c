"""One optimizer step, shared by everything that trains: accumulate, backward, clip, handle non-finite values.

The summed loss of ``accumulate`` micro-batches is normalised by the number of targets of the whole
step (all micro-batches, all ranks), so that accumulation and data parallelism equal one big batch.
A non-finite loss or gradient norm stops before the optimizer step (``nonfinite="raise"``) or drops
the step (``"skip"``), decided the same on every rank. With ``master`` (``train.precision: bf16-master``) the
runner trains bf16 copies: where :meth:`MasterWeights.step` can step the optimizer (Adam or AdamW, the native library
built), it does so from the copies' gradients and writes the copies in the same pass (accumulated micro-batches are
added into fp32 gradients first); otherwise their gradients go into the fp32 masters after each micro-batch, and the
masters are cast into the copies after each optimizer step. The global gradient norm is :func:`global_norm`'s, and
the gradients are multiplied by the clipping coefficient only where it is below 1 (torch's ``clip_grad_norm_``
multiplies by 1 too: a pass over every gradient for nothing).
"""

from __future__ import annotations

import contextlib
import logging
import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from torch import Tensor, nn

from aiayn.inference import gemv
from aiayn.training.distributed import DistInfo, all_reduce_sum, rank_values
from aiayn.training.losses import TokenLoss
from aiayn.training.master_weights import MasterWeights
from aiayn.training.objectives import loss_count

__all__ = ["TrainStep", "StepResult", "MAX_SKIPPED_IN_A_ROW"]

log = logging.getLogger(__name__)
MAX_SKIPPED_IN_A_ROW = 100


@dataclass(frozen=True)
class StepResult:
    loss: float  # mean loss per target over the whole step (all micro-batches, all ranks)
    grad_norm: float  # the global gradient norm before clipping
    targets: int  # how many targets the loss averaged over


class TrainStep:
    """``step(micro_batches, number) -> StepResult``, or None when a non-finite step is skipped.

    ``runner(batch) -> TokenLoss`` (the objective, maybe compiled or wrapped in DDP); ``count(batch)``
    is the number of targets its loss sums over, known before the forward pass.
    """

    def __init__(
        self,
        runner: Callable[[Any], TokenLoss],
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
        grad_clip: float | None = None,
        nonfinite: str = "raise",
        autocast: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext,
        scaler: torch.amp.GradScaler | None = None,
        dist_info: DistInfo = DistInfo(),
        device: torch.device = torch.device("cpu"),
        count: Callable[[Any], int] = loss_count,
        master: MasterWeights | None = None,
    ) -> None:
        if nonfinite not in ("raise", "skip"):
            raise ValueError(f"nonfinite={nonfinite!r} must be one of ('raise', 'skip')")
        self.runner, self.model, self.optimizer, self.scheduler = runner, model, optimizer, scheduler
        self.grad_clip, self.nonfinite, self.autocast, self.count = grad_clip, nonfinite, autocast, count
        self.scaler = scaler if scaler is not None else torch.amp.GradScaler("cuda", enabled=False)
        self.dist, self.device, self.master = dist_info, device, master
        # bf16-master: the optimizer stepped by MasterWeights.step where it can be
        self.fused = master is not None and not scaler_enabled(scaler) and master.fused_blocker(optimizer) is None
        self.skipped = 0  # non-finite steps skipped in a row
        self._local_loss = 0.0

    def __call__(self, micro: Sequence[Any], number: int) -> StepResult | None:
        """Step ``number`` (1-based, for messages) over the micro-batches ``micro``, already on the device."""
        with self.master.swapped() if self.master is not None else contextlib.nullcontext():
            loss, targets = self._backward(micro)  # bf16-master: forward and backward (recomputation too) on the copies
        self.scaler.unscale_(self.optimizer)
        grads = self.master.gradients() if self.fused else [p.grad for p in self.model.parameters() if p.grad is not None]  # type: ignore[union-attr]
        norm = global_norm(grads)
        full = norm.full_tensor() if hasattr(norm, "full_tensor") else norm  # FSDP: a DTensor
        grad_norm = float(full)
        # Each rank says whether its own loss (1) or the gradient norm (2) is non-finite, so the message names the rank.
        codes = rank_values((not math.isfinite(self._local_loss)) + 2 * (not math.isfinite(grad_norm)), self.dist, self.device)
        if any(codes):
            if self.scaler.is_enabled() and not any(c & 1 for c in codes):
                self._overflow(grad_norm, number)
                return None
            self._drop(f"non-finite loss ({loss}) or gradient norm ({grad_norm}) at step {number}{_where(codes)}")
            return None
        self.skipped = 0
        max_norm = self.grad_clip or math.inf
        coefficient = float(torch.clamp(max_norm / (full + 1e-6), max=1.0))  # clip_grad_norm_'s, in its dtype
        if self.fused:
            self.master.step(self.optimizer, coefficient)  # type: ignore[union-attr]
        else:
            if coefficient < 1.0:
                torch.nn.utils.clip_grads_with_norm_(self.model.parameters(), max_norm, norm)
            self.scaler.step(self.optimizer)
            self.scaler.update()
            if self.master is not None:
                self.master.update_copies()
        if self.scheduler is not None:
            self.scheduler.step()
        self._zero_grad()
        return StepResult(loss, grad_norm, int(targets))

    def _zero_grad(self) -> None:
        """Drop every gradient before the next step: the optimizer's parameters' and the bf16 copies'."""
        self.optimizer.zero_grad(set_to_none=True)
        if self.master is not None:
            self.master.zero_grad()  # the copies' too: an unused gradient must not reach the next step

    def _backward(self, micro: Sequence[Any]) -> tuple[float, float]:
        """Backpropagate every micro-batch; return the step's mean loss and its target count."""
        # Normalise by the target count of the whole step, so accumulation and DDP equal one big batch.
        targets = float(all_reduce_sum(torch.tensor(float(sum(self.count(b) for b in micro)), device=self.device), self.dist))
        loss_sum = torch.zeros((), device=self.device)
        for i, batch in enumerate(micro):
            # DDP: all-reduce the gradients once, after the last micro-batch.
            # (FSDP reduce-scatters after every micro-batch: it has no no_sync.)
            last = i == len(micro) - 1 or not hasattr(self.runner, "no_sync")
            with contextlib.nullcontext() if last else self.runner.no_sync():  # type: ignore[attr-defined]
                with self.autocast():
                    loss = self.runner(batch)
                self.scaler.scale(loss.sum * (self.dist.world_size / targets)).backward()
            if self.master is not None and (not self.fused or len(micro) > 1):  # fp32 sums of several micro-batches
                self.master.accumulate_grads()
            loss_sum += loss.sum.detach().float()
        self._local_loss = float(loss_sum)  # this rank's own, before the all-reduce (names a bad rank)
        return float(all_reduce_sum(loss_sum, self.dist)) / max(targets, 1.0), targets

    def _overflow(self, grad_norm: float, number: int) -> None:
        """fp16: an overflow in the scaled gradients is the GradScaler's business: skip the step, lower the scale."""
        scale = self.scaler.get_scale()
        self.scaler.step(self.optimizer)  # sees the inf found by unscale_ and skips optimizer.step()
        self.scaler.update()
        self._zero_grad()
        log.info("step %d: fp16 gradients overflowed (norm %s) at scale %g: step skipped, scale now %g",
                 number, grad_norm, scale, self.scaler.get_scale())
        return None

    def _drop(self, message: str) -> None:
        """A non-finite step: raise, or (``nonfinite="skip"``) drop it, giving up after too many in a row."""
        self._zero_grad()
        if self.nonfinite == "raise":
            raise FloatingPointError(f"{message}; stopped before the optimizer step (train.nonfinite=skip would drop the step)")
        self.skipped += 1
        log.warning("%s: step skipped (%d in a row)", message, self.skipped)
        if self.skipped >= MAX_SKIPPED_IN_A_ROW:
            raise FloatingPointError(f"{message}; {self.skipped} steps in a row skipped, giving up")
        self.scaler.update()


def global_norm(grads: list[Tensor]) -> Tensor:
    """The 2-norm of all ``grads`` together: our ``norm_of_all`` (``aiayn/inference/adamw.cpp``: fp32 sums of blocks,
    added in fp64; bf16 read as it is) for fp32 and bf16 CPU tensors where the native library is built, else torch's
    ``get_total_norm`` (FSDP's DTensors, other devices). Over GPT-2 small's fp32 gradients (AMX Xeon, 2026-12-06;
    docs/benchmarks.md) torch's took 47.6 ms and was 9e-4 off the float64 value, ours 21.2 ms and 3e-8."""
    if grads and all(type(g) is Tensor and g.device.type == "cpu" and g.dtype in (torch.float32, torch.bfloat16) for g in grads):
        if gemv.available():
            return torch.tensor(torch.ops.aiayn_native.norm_of_all([g.contiguous() for g in grads]), dtype=torch.float32)
    return torch.nn.utils.get_total_norm(grads, 2.0)


def scaler_enabled(scaler: torch.amp.GradScaler | None) -> bool:
    """Whether ``scaler`` scales the loss (fp16): its steps go through torch's optimizer, which it watches."""
    return scaler is not None and scaler.is_enabled()


def _where(codes: list[int]) -> str:
    """Which ranks a non-finite step came from (empty on one process)."""
    if len(codes) == 1:
        return ""
    losses = [str(rank) for rank, code in enumerate(codes) if code & 1]
    if losses:
        return f" (non-finite loss on rank {', '.join(losses)} of {len(codes)})"
    return f" (the all-reduced gradients, on all {len(codes)} ranks)"
