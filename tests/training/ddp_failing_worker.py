"""A torchrun worker whose rank 1 raises at its second step (for the no-hang test)."""

import sys

import torch.distributed as dist

from aiayn.config_io import load_yaml
from aiayn.training.config import TrainConfig
from aiayn.training.loop import train
from aiayn.training.objectives import Objective

original = Objective.forward
calls = {"n": 0}


def failing(self, batch):
    calls["n"] += 1
    if dist.is_initialized() and dist.get_rank() == 1 and calls["n"] == 2:
        raise RuntimeError("rank 1 fails on purpose")
    return original(self, batch)


Objective.forward = failing
train(load_yaml(sys.argv[1], TrainConfig))
