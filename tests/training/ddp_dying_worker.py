"""A torchrun worker whose rank 1 dies (os._exit) at its 6th training micro-batch, in the first attempt only.

Under ``torchrun --max-restarts=1`` the whole group is restarted (TORCHELASTIC_RESTART_COUNT=1) and
the run must resume from its last checkpoint by itself.
"""

import logging
import os
import sys

import torch.distributed as dist

from aiayn.config_io import load_yaml
from aiayn.training.config import TrainConfig
from aiayn.training.loop import train
from aiayn.training.objectives import Objective

original = Objective.forward
calls = {"n": 0}


def dying(self, batch):
    if self.training and dist.is_initialized() and dist.get_rank() == 1:
        calls["n"] += 1
        if calls["n"] == 6 and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0":
            os._exit(17)  # no exception, no clean-up: the process is simply gone
    return original(self, batch)


Objective.forward = dying
logging.basicConfig(level=logging.INFO, format="%(message)s")  # 'resumed from ...' for the test to read
train(load_yaml(sys.argv[1], TrainConfig))
