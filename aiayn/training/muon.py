"""Muon for the blocks' matrices, AdamW for everything else, behind one optimizer (the modded-nanogpt split).

Muon (Jordan et al., 2024; ``torch.optim.Muon``) orthogonalises the momentum of a 2-D weight with a
few Newton-Schulz iterations; it is meant for hidden matrices only. Embeddings, the output head,
norms and biases stay with AdamW. The pair looks like one ``torch.optim.Optimizer`` to the loop: its
``param_groups`` are both optimizers' groups (so one LR schedule scales both), its ``state_dict``
holds both.

torch runs the Newton-Schulz iteration in bf16, which is right where bf16 matrix products are native (GPUs,
AMX); on a CPU without them a bf16 product is a slow generic loop, so :class:`Muon` runs it in fp32 there.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.optim._muon import _adjust_lr  # torch's scaling of the rate by the matrix's shape

from aiayn.inference.precision import native_bf16
from aiayn.nn.blocks import TransformerLayer
from aiayn.nn.positional import PositionalEncoding

__all__ = ["Muon", "MuonWithAdamW", "muon_split", "newton_schulz"]


def muon_split(model: nn.Module) -> tuple[list[str], list[str]]:
    """(names for Muon, names for AdamW): Muon takes the 2-D weights of the Transformer blocks' linear maps."""
    matrices: set[int] = set()
    tables: set[int] = set()  # a position table reaches the blocks through their attention, but is no matrix
    for module in model.modules():
        if isinstance(module, TransformerLayer):
            matrices.update(id(p) for p in module.parameters() if p.ndim == 2)
        if isinstance(module, PositionalEncoding):
            tables.update(id(p) for p in module.parameters())
    matrices -= tables
    muon: list[str] = []
    rest: list[str] = []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (muon if id(p) in matrices else rest).append(name)
    return muon, rest


def newton_schulz(g: torch.Tensor, coefficients: tuple[float, float, float], steps: int, eps: float, dtype: torch.dtype) -> torch.Tensor:
    """The quintic Newton-Schulz iteration of ``torch.optim.Muon`` (``U S' V^T`` with ``S'`` near 1 for
    ``g = U S V^T``), computed in ``dtype``."""
    a, b, c = coefficients
    x = g.to(dtype)
    tall = g.size(0) > g.size(1)
    if tall:
        x = x.T
    x = x / x.norm().clamp(min=eps)  # spectral norm at most 1
    for _ in range(steps):
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.T if tall else x


class Muon(torch.optim.Muon):
    """``torch.optim.Muon`` whose Newton-Schulz iteration runs in ``ns_dtype`` (torch's is bf16).

    On the AVX2 CPU of ``docs/training.md`` bf16 took 3.4 s of a 3.9 s speedrun step; fp32 takes
    milliseconds. With ``ns_dtype=torch.bfloat16`` this is ``torch.optim.Muon`` itself.
    """

    def __init__(self, params: Any, *, ns_dtype: torch.dtype = torch.bfloat16, **kwargs: Any) -> None:
        super().__init__(params, **kwargs)
        self.ns_dtype = ns_dtype

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        if self.ns_dtype == torch.bfloat16:
            return super().step(closure)
        if closure is not None:
            raise ValueError("Muon.step takes no closure")
        for group in self.param_groups:  # torch's _single_tensor_muon, step for step
            params: list[torch.Tensor] = []
            grads: list[torch.Tensor] = []
            bufs: list[torch.Tensor] = []
            self._init_group(group, params, grads, bufs)
            lr, momentum = float(group["lr"]), group["momentum"]
            for param, grad, buf in zip(params, grads, bufs):
                buf.lerp_(grad, 1 - momentum)
                update = grad.lerp(buf, momentum) if group["nesterov"] else buf
                update = newton_schulz(update, group["ns_coefficients"], group["ns_steps"], group["eps"], self.ns_dtype)
                param.mul_(1 - lr * group["weight_decay"])
                param.add_(update.to(param.dtype), alpha=-_adjust_lr(lr, group["adjust_lr_fn"], param.shape))
        return None


class MuonWithAdamW(torch.optim.Optimizer):
    """``torch.optim.Muon`` over ``matrices`` and ``torch.optim.AdamW`` over ``adamw_groups``.

    ``lr`` of a group is its own base rate (Muon's ``muon_lr``, AdamW's ``lr``); a scheduler multiplies
    each. Raises ``ValueError`` when there is no matrix for Muon.
    """

    def __init__(
        self,
        matrices: list[tuple[str, torch.Tensor]],
        adamw_groups: list[dict[str, Any]],
        *,
        muon_lr: float,
        muon_momentum: float,
        muon_weight_decay: float,
        lr: float,
        betas: tuple[float, float],
        eps: float,
        fused: bool | None = None,
    ) -> None:
        if not matrices:
            raise ValueError("optim.name='muon' needs 2-D weight matrices in Transformer blocks; the model has none")
        device = matrices[0][1].device
        self.muon = Muon(
            matrices, lr=muon_lr, momentum=muon_momentum, weight_decay=muon_weight_decay, adjust_lr_fn="original",
            ns_dtype=torch.bfloat16 if native_bf16(device) else torch.float32,
        )
        self.adamw = torch.optim.AdamW(adamw_groups, lr=lr, betas=betas, eps=eps, fused=fused) if adamw_groups else None
        parts = [o for o in (self.muon, self.adamw) if o is not None]
        # The base class keeps hooks and bookkeeping; its own groups are replaced by the parts' groups.
        super().__init__([p for o in parts for g in o.param_groups for p in g["params"]], {"lr": lr})
        self.param_groups = [g for o in parts for g in o.param_groups]
        self._parts = parts

    @property  # type: ignore[override]
    def state(self) -> dict[Any, Any]:  # the parts keep their own state
        merged: dict[Any, Any] = {}
        for o in getattr(self, "_parts", []):
            merged.update(o.state)
        return merged

    @state.setter
    def state(self, value: Any) -> None:  # the base __init__ assigns an empty state
        pass

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        if closure is not None:
            raise ValueError("MuonWithAdamW.step takes no closure")
        for o in self._parts:
            o.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for o in self._parts:
            o.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        return {"muon": self.muon.state_dict(), "adamw": None if self.adamw is None else self.adamw.state_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if set(state_dict) != {"muon", "adamw"}:
            raise ValueError(f"not a Muon+AdamW optimizer state (keys {sorted(state_dict)}; expected adamw, muon)")
        self.muon.load_state_dict(state_dict["muon"])
        if self.adamw is not None:
            self.adamw.load_state_dict(state_dict["adamw"])
        self.param_groups = [g for o in self._parts for g in o.param_groups]
