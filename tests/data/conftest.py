from __future__ import annotations

from pathlib import Path

import pytest

SHARED_DATA = Path(__file__).resolve().parents[2] / ".." / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The real data sets beside the clone (``../shared/data``); skips the test when absent."""
    if not (SHARED_DATA / "multi30k").is_dir():
        pytest.skip(f"real data not found at {SHARED_DATA.resolve()} (expected ../shared/data beside the repo)")
    return SHARED_DATA.resolve()
