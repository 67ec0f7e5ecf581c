"""Fewer, larger matmuls at inference: self-attention's Q, K and V projections as one Linear layer, and
SwiGLU's gate and up projections as one, fused once at load. Checkpoint keys do not change.

At batch 1 each Linear call has a fixed cost (dispatch, a thread fork, the kernel's set-up) beside its
bytes; a GPT-2 block makes 6 calls where 4 do the same work. The fused layer is the three (two) layers'
rows stacked, whatever their kind: ``nn.Linear`` or the int8/int4 layers, whose scales are per row (int8)
or per group of a row (int4), so stacking rows is exact and a fused quantised layer computes what the
separate ones did. ``state_dict`` splits the fused rows back under the original keys, and loading a state
dict joins them, so a fused model saves and loads as the unfused one.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["fuse_projections", "stack_rows"]

# module attribute holding the fused layer -> the attributes it replaces, in row order
FUSIONS = {"w_qkv": ("w_q", "w_k", "w_v"), "w_gate_up": ("w_gate", "w_1")}


def stack_rows(parts: list[Any]) -> nn.Module:
    """One layer of ``parts``' kind whose output rows are theirs, in order (every tensor's dim 0 stacked)."""
    fused = copy.deepcopy(parts[0])
    tensors = dict(parts[0].named_parameters(recurse=False)) | dict(parts[0].named_buffers(recurse=False))
    persistent = set(parts[0].state_dict().keys())
    for name in tensors:
        if name not in persistent:  # derived (an int4 kernel layout): rebuilt below
            continue
        joined = torch.cat([getattr(p, name).detach() for p in parts])
        original = getattr(parts[0], name)
        if isinstance(original, nn.Parameter):
            setattr(fused, name, nn.Parameter(joined, requires_grad=original.requires_grad))
        else:
            setattr(fused, name, joined)
    fused.out_features = sum(int(p.out_features) for p in parts)
    repack = getattr(fused, "repack", None)
    if repack is not None:  # int4: the kernel's packed layout of the stacked codes
        repack()
    return fused


def fuse_projections(model: nn.Module) -> int:
    """Fuse every self-attention's Q/K/V and every SwiGLU's gate/up in ``model``, in place; returns how many.

    Layers of different kinds (one int8, one float) or without matching biases are left as they are."""
    count = 0
    for module in model.modules():
        for fused_name, names in FUSIONS.items():
            if getattr(module, fused_name, "absent") is not None or getattr(module, "cross", False):
                continue  # not a fusable module, already fused, or cross-attention (K, V read the memory)
            found = [getattr(module, n, None) for n in names]
            parts: list[Any] = [p for p in found if p is not None]
            if len(parts) != len(names) or len({type(p) for p in parts}) != 1:
                continue
            if len({p.bias is None for p in parts}) != 1 or len({p.in_features for p in parts}) != 1:
                continue
            order = [n for n in module._modules if n in names]  # where the parts stood: the state dict's order
            fused = stack_rows(parts)
            rebuilt: dict[str, nn.Module | None] = {}
            for key, child in module._modules.items():  # the fused layer where the first part stood; the parts None
                if key == order[0]:
                    rebuilt[fused_name] = fused
                if key != fused_name:
                    rebuilt[key] = None if key in names else child
            module.__dict__.pop(fused_name, None)  # the None placeholder set in __init__, a plain attribute
            module._modules.clear()
            module._modules.update(rebuilt)
            module.register_state_dict_post_hook(_split_hook(fused_name, names, [p.out_features for p in parts], order))
            module.register_load_state_dict_pre_hook(_join_hook(fused_name, names))
            count += 1
    return count


def _split_hook(fused_name: str, names: tuple[str, ...], sizes: list[int], order: list[str]):
    """``state_dict``: the fused layer's rows back under the original layers' keys, where they stood."""

    def hook(module: nn.Module, state: dict[str, Tensor], prefix: str, local_metadata: object) -> None:
        head = f"{prefix}{fused_name}."
        keys = list(state)
        first = next((i for i, k in enumerate(keys) if k.startswith(head)), None)
        if first is None:
            return
        # this module's entries come last (the hook runs after its subtree): re-append them in the unfused order
        tail = {k: state.pop(k) for k in keys[first:]}
        fused = {k[len(head):]: v for k, v in tail.items() if k.startswith(head)}
        parts = {leaf: dict(zip(names, tensor.split(sizes, dim=0))) for leaf, tensor in fused.items()}
        for name in order:
            for leaf in fused:
                state[f"{prefix}{name}.{leaf}"] = parts[leaf][name]
        state.update((k, v) for k, v in tail.items() if not k.startswith(head))
    return hook


def _join_hook(fused_name: str, names: tuple[str, ...]):
    """``load_state_dict``: the original layers' keys joined into the fused layer's."""

    def hook(module: nn.Module, state: dict, prefix: str, *args: object) -> None:
        first = f"{prefix}{names[0]}."
        for key in [k for k in state if k.startswith(first)]:
            leaf = key[len(first):]
            parts = [state.pop(f"{prefix}{n}.{leaf}") for n in names if f"{prefix}{n}.{leaf}" in state]
            state[f"{prefix}{fused_name}.{leaf}"] = torch.cat(parts)
    return hook
