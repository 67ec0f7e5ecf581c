"""bf16 parameters with an fp32 master copy (``train.precision: bf16-master``): the forward and backward run
on bf16 copies of the weights, cast once per optimizer step, where autocast casts every weight at every
forward (and keeps the casts for the backward).

The model keeps its fp32 parameters, the masters: the optimizer steps them, the gradient norm is clipped
on them and checkpoints save them, so a checkpoint is the one an fp32 run writes and a resume is bit for
bit (the copies are made again from the masters). After each micro-batch's backward the bf16 gradients of
the copies are added into the masters' fp32 ``.grad`` (accumulation stays fp32; torch's fused CPU AdamW
needs gradients of its parameters' dtype: "expected scalar type Float but found BFloat16" in torch 2.13);
after ``optimizer.step()`` the masters are cast into the copies.

Where the optimizer is torch's Adam or AdamW in its plain form and our native library is built, :meth:`step` does the
optimizer's work in one pass instead (``aiayn/inference/adamw.cpp``): it reads the copies' bf16 gradients (or the fp32
ones of accumulated micro-batches), updates the masters and the optimizer's own moments, and writes the copies. The
optimizer's state keeps torch's form, so checkpoints are those of the optimizer and a resume may take either path.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor, nn

from aiayn.inference import gemv

__all__ = ["MasterWeights"]


class MasterWeights:
    """bf16 working copies of ``model``'s parameters (and floating buffers); the model's own stay fp32."""

    def __init__(self, model: nn.Module, dtype: torch.dtype = torch.bfloat16) -> None:
        self.masters: dict[str, nn.Parameter] = dict(model.named_parameters())  # a tied parameter once
        with torch.no_grad():
            self.copies: dict[str, Tensor] = {
                name: p.detach().to(dtype).requires_grad_(p.requires_grad) for name, p in self.masters.items()
            }
            by_id = {id(p): self.copies[name] for name, p in self.masters.items()}
            floating = {id(b): b.to(dtype) for b in model.buffers() if b.is_floating_point()}
        # Every (module table, name) holding a master or a floating buffer, and its copy: a module shared by
        # two paths is visited once, and a weight tied to another gets the same copy in both tables
        # (torch.func.functional_call restored such a model with its tie broken in torch 2.13: hence this swap).
        self._names = {id(p): name for name, p in self.masters.items()}  # an optimizer's parameter -> its name
        self._slots: list[tuple[dict[str, Any], str, Tensor]] = []
        for module in model.modules():
            for table, copies in ((module._parameters, by_id), (module._buffers, floating)):
                self._slots += [(table, name, copies[id(t)]) for name, t in table.items() if t is not None and id(t) in copies]

    def working_tensors(self) -> list[Tensor]:
        """Every bf16 tensor the model computes with inside :meth:`swapped` (the copies and the cast buffers)."""
        return list({id(copy): copy for _, _, copy in self._slots}.values())

    @contextlib.contextmanager
    def swapped(self) -> Iterator[None]:
        """The model computes with the copies inside this block (its own tensors are back after it). Run the
        backward inside it too: activation checkpointing recomputes the forward there."""
        originals = [table[name] for table, name, _ in self._slots]
        try:
            for table, name, copy in self._slots:
                table[name] = copy
            yield
        finally:
            for (table, name, _), original in zip(self._slots, originals):
                table[name] = original

    @torch.no_grad()
    def accumulate_grads(self) -> None:
        """Add the copies' bf16 gradients into the masters' fp32 ``.grad`` and clear the copies'."""
        for name, copy in self.copies.items():
            if copy.grad is None:
                continue
            master = self.masters[name]
            if master.grad is None:
                master.grad = copy.grad.to(master.dtype)
            else:
                master.grad.add_(copy.grad)
            copy.grad = None

    @torch.no_grad()
    def update_copies(self) -> None:
        """Cast the masters into the copies: once per optimizer step."""
        for name, copy in self.copies.items():
            copy.copy_(self.masters[name])

    def fused_blocker(self, optimizer: torch.optim.Optimizer) -> str | None:
        """What keeps :meth:`step` from stepping ``optimizer`` (a phrase), or ``None`` where it can."""
        if type(optimizer) not in (torch.optim.Adam, torch.optim.AdamW):
            return f"a {type(optimizer).__name__} (torch's Adam and AdamW only)"
        for group in optimizer.param_groups:
            for flag in ("amsgrad", "maximize", "capturable", "differentiable"):
                if group.get(flag):
                    return f"{flag}=True"
            if isinstance(group["lr"], Tensor):
                return "a tensor learning rate"
            if any(id(p) not in self._names for p in group["params"]):
                return "a parameter that is not one of the model's"
        return gemv.unavailable_reason()

    def gradients(self) -> list[Tensor]:
        """Every parameter's :meth:`_gradient` there is."""
        return [g for g in map(self._gradient, self.masters) if g is not None]

    def _gradient(self, name: str) -> Tensor | None:
        """Parameter ``name``'s gradient as the backward left it: the master's fp32 ``.grad`` where micro-batches were
        accumulated into it (:meth:`accumulate_grads`), else the copy's bf16 one (``None`` without either)."""
        grad = self.masters[name].grad
        return grad if grad is not None else self.copies[name].grad

    def zero_grad(self) -> None:
        """Drop every gradient, the masters' and the copies'."""
        for name, master in self.masters.items():
            master.grad = self.copies[name].grad = None

    @torch.no_grad()
    def step(self, optimizer: torch.optim.Optimizer, grad_scale: float = 1.0) -> None:
        """One step of ``optimizer`` (Adam or AdamW, :meth:`fused_blocker` is ``None``) on the masters from
        :meth:`gradients`, each times ``grad_scale`` (gradient clipping's coefficient), the copies written in the same
        pass; the gradients are dropped after. The optimizer's ``step()`` is then called over no gradient (an update of
        nothing) so that what follows its calls (a learning-rate scheduler's order check, hooks) sees a step."""
        for group in optimizer.param_groups:
            by_step: dict[float, list[list[Tensor]]] = {}  # step number -> masters, grads, exp_avgs, exp_avg_sqs, copies
            for master in group["params"]:
                name = self._names[id(master)]
                grad = self._gradient(name)
                if grad is None:
                    continue
                state = optimizer.state[master]
                if not state:  # as torch's Adam starts a parameter (its fused form: a float32 step on the device)
                    state["step"] = torch.zeros((), dtype=torch.float32, device=master.device)
                    state["exp_avg"] = torch.zeros_like(master, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(master, memory_format=torch.preserve_format)
                state["step"] += 1
                lists = by_step.setdefault(float(state["step"]), [[], [], [], [], []])
                for into, tensor in zip(lists, (master, grad.contiguous(), state["exp_avg"], state["exp_avg_sq"], self.copies[name])):
                    into.append(tensor)
            beta1, beta2 = group["betas"]
            decoupled = type(optimizer) is torch.optim.AdamW or bool(group.get("decoupled_weight_decay"))
            for count, tensors in by_step.items():  # one call per step number (a parameter that joined later counts from 1)
                torch.ops.aiayn_native.adamw_step(*tensors, float(group["lr"]), float(beta1), float(beta2), float(group["weight_decay"]),
                                                  float(group["eps"]), count, float(grad_scale), decoupled)
        self.zero_grad()
        optimizer.step()  # over no gradient: torch's bookkeeping only
