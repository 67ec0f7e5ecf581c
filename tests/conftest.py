"""Shared test set-up: the training fixtures are importable from every test folder, and torch runs
on one thread in each test process (make test runs one process per core, with pytest-xdist)."""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent / "training"))
torch.set_num_threads(1)
