"""Fully sharded data parallelism (``train.parallel: fsdp``): each rank holds 1/N of every parameter,
gradient and optimizer state, gathering a block's full weights only while that block runs.

This is PyTorch's FSDP2 (``torch.distributed.fsdp.fully_shard``), applied per Transformer block and
then to the whole model (embeddings, output, final norm), as torchtitan does. With ``train.precision:
bf16`` the gathered parameters are bf16 while gradients are reduced in fp32 and the sharded master
weights stay fp32; ``train.cpu_offload`` keeps the shards and optimizer state in CPU memory.
"""

from __future__ import annotations

import os

import torch
from torch import nn

from aiayn.nn.positional import PositionalEncoding
from aiayn.training.activation_checkpointing import transformer_blocks

__all__ = ["shard_model", "check_under_torchrun"]


def check_under_torchrun() -> None:
    """``train.parallel=fsdp`` needs the process group torchrun describes; say so before any work."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        raise ValueError(
            "train.parallel='fsdp' needs torchrun (RANK and WORLD_SIZE are not set): launch with "
            "`torchrun --nproc_per_node=N -m aiayn train ...` (N may be 1), or use train.parallel='ddp'"
        )


def shard_model(model: nn.Module, *, bf16: bool = False, cpu_offload: bool = False) -> int:
    """``fully_shard`` every block of ``model``, then the model itself, in place; return the number of blocks.

    Raises ``ValueError`` when the model has no Transformer blocks.
    """
    # imported here: torch.distributed.fsdp (and DTensor under it) costs 1.2 s of every process's start, FSDP or not
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    blocks = transformer_blocks(model)
    if not blocks:
        raise ValueError(f"train.parallel='fsdp' shards Transformer blocks; {type(model).__name__} has none")
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else MixedPrecisionPolicy()
    offload = CPUOffloadPolicy() if cpu_offload else OffloadPolicy()
    # A position module (a learned table) is shared by the embedding and every block's attention:
    # it belongs to the root unit, which is gathered whenever the model runs.
    shared = {p for m in model.modules() if isinstance(m, PositionalEncoding) for p in m.parameters()}
    for block in blocks:
        fully_shard(block, mp_policy=policy, offload_policy=offload, ignored_params=shared or None)
    fully_shard(model, mp_policy=policy, offload_policy=offload)
    return len(blocks)
