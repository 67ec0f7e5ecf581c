"""Shared test set-up: the training fixtures are importable from every test folder, and torch runs
on one thread in each test process (make test runs one process per core, with pytest-xdist)."""

import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent / "training"))
torch.set_num_threads(1)
# Linear kernels as a fixed rule (oneDNN wherever it packs), not timed per machine: results do not depend
# on which kernel won a timing, and no test writes the user's kernel cache (tests/inference/test_kernel_choice.py
# covers the measured choice with its own cache).
os.environ.setdefault("AIAYN_LINEAR_KERNEL", "packed")
os.environ.setdefault("AIAYN_ATTENTION_KERNEL", "sdpa")  # likewise one-query attention: torch's fused kernel, as before it was timed
os.environ.setdefault("AIAYN_ACTIVATION_KERNEL", "torch")  # and GPT-2's GELU: torch's (tests/inference/test_gelu_tanh.py times ours)
os.environ.setdefault("AIAYN_TRAINING_ATTENTION", "rule")  # and training attention: the rule's kernel (tests/nn/test_native_attention.py times ours)
os.environ.setdefault("AIAYN_LOSS_KERNEL", "torch")  # and the loss: torch's operators (tests/training/test_chunked_cross_entropy.py times ours)
os.environ.setdefault("AIAYN_DROPOUT_KERNEL", "torch")  # and dropout: torch's (tests/nn/test_dropout.py times ours)
os.environ.setdefault("AIAYN_HUGE_PAGES", "off")  # and weights on 4 KiB pages, not timed (tests/inference/test_huge_pages.py places them)
os.environ.setdefault("AIAYN_COMPILE_WRAPPER", "python")  # and a compiled step: Inductor's Python wrapper, one compile (tests/decoding/test_step_wrapper.py times both)


def pytest_collection_modifyitems(config, items):
    """The tests marked slow run first (in collection order otherwise), so that with several workers
    the long ones start early and the short ones fill in around them, instead of one long test
    starting last and running alone."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(autouse=True, scope="session")
def _subprocess_temporary_files(tmp_path_factory):
    """Temporary files of the processes tests start under pytest's own temporary folder (which pytest prunes to the last
    three runs), not the system's: torchrun leaves a ``torchelastic_*`` log folder in $TMPDIR at every launch."""
    before = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = str(tmp_path_factory.mktemp("tmp"))
    yield
    if before is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = before


@pytest.fixture
def native_gemv():
    """aiayn's native matrix-vector kernel (aiayn.inference.gemv), built into the user cache once per machine;
    the test is skipped, with the reason, where it does not build. Ask for it before fixtures that move the cache."""
    from aiayn.inference import gemv

    if not gemv.available():
        pytest.skip(f"the native kernel does not build here: {gemv.unavailable_reason()}")
    return gemv
