"""A torchrun worker whose rank 1 alone gets an infinite loss at its second micro-batch."""

import sys

import torch.distributed as dist

from aiayn.config_io import load_yaml
from aiayn.training.config import TrainConfig
from aiayn.training.loop import train
from aiayn.training.objectives import Objective

original = Objective.forward
calls = {"n": 0}


def poisoned(self, batch):
    loss = original(self, batch)
    if self.training and dist.is_initialized() and dist.get_rank() == 1:
        calls["n"] += 1
        if calls["n"] == 2:
            return type(loss)(loss.sum * float("inf"), loss.count)
    return loss


Objective.forward = poisoned
train(load_yaml(sys.argv[1], TrainConfig))
