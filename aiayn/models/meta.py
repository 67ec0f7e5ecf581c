"""Build a model on the ``meta`` device: every tensor's shape and dtype, no memory, no random init.

Used to compare an untrusted config with a weights file's header before allocating anything.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.overrides import TorchFunctionMode

from aiayn.models.config import TransformerConfig
from aiayn.models.presets import model_class

__all__ = ["meta_state_dict"]


class _MetaWithoutDynamo(TorchFunctionMode):
    """Meta tensors without the work that imports torch._dynamo (about a second, paid by every load): ``normal_`` on
    a meta tensor fills nothing, and the small tables a module computes in ``__init__`` (sinusoids, rotary frequencies,
    the SSM's initial values) are built on the CPU, where meta versions of arange, exp and the like run through
    Python decompositions that import it. Weights (``torch.empty``: ``nn.Linear``, ``nn.Parameter(torch.empty(...))``)
    stay on ``meta``."""

    _SKIPPED = (torch.Tensor.normal_, torch.nn.init.normal_, torch.nn.init.trunc_normal_)
    _ON_CPU = (torch.arange, torch.rand, torch.randn, torch.zeros, torch.ones, torch.full, torch.linspace, torch.tensor)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        target = args[0] if args else kwargs.get("tensor", kwargs.get("self"))
        if func in self._SKIPPED and isinstance(target, Tensor) and target.is_meta:
            return target
        if func in self._ON_CPU and kwargs.get("device") is None:
            kwargs["device"] = "cpu"
        return func(*args, **kwargs)


def meta_state_dict(config: TransformerConfig) -> dict[str, Tensor]:
    """The ``state_dict`` the model of ``config`` would have, as meta tensors (shapes and dtypes only)."""
    with torch.device("meta"), _MetaWithoutDynamo():
        state = model_class(config)(config).state_dict()
    return {k: v if v.is_meta else v.to("meta") for k, v in state.items()}  # a parameter made of a table
