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


class _SkipMetaNormal(TorchFunctionMode):
    """``normal_`` on a meta tensor imports torch._dynamo (seconds); filling nothing needs no kernel."""

    _SKIPPED = (torch.Tensor.normal_, torch.nn.init.normal_, torch.nn.init.trunc_normal_)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        target = args[0] if args else kwargs.get("tensor", kwargs.get("self"))
        if func in self._SKIPPED and isinstance(target, Tensor) and target.is_meta:
            return target
        return func(*args, **kwargs)


def meta_state_dict(config: TransformerConfig) -> dict[str, Tensor]:
    """The ``state_dict`` the model of ``config`` would have, as meta tensors (shapes and dtypes only)."""
    with torch.device("meta"), _SkipMetaNormal():
        return model_class(config)(config).state_dict()
