"""bf16 parameters with an fp32 master copy (``train.precision: bf16-master``): the forward and backward run
on bf16 copies of the weights, cast once per optimizer step, where autocast casts every weight at every
forward (and keeps the casts for the backward).

The model keeps its fp32 parameters, the masters: the optimizer steps them, the gradient norm is clipped
on them and checkpoints save them, so a checkpoint is the one an fp32 run writes and a resume is bit for
bit (the copies are made again from the masters). After each micro-batch's backward the bf16 gradients of
the copies are added into the masters' fp32 ``.grad`` (accumulation stays fp32; torch's fused CPU AdamW
needs gradients of its parameters' dtype: "expected scalar type Float but found BFloat16" in torch 2.13);
after ``optimizer.step()`` the masters are cast into the copies.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor, nn

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
