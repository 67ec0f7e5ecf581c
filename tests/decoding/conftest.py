import pytest
import torch


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models step by step: intra-op threads only add contention on a shared machine (~10x slower)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
