"""Fixtures of the inference tests."""

import pytest

from aiayn.inference import kernel_choice


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """The kernel-choice cache in an empty user cache, this process's answers forgotten, every native operator's choice
    set to ``measure`` and the machine quiet (the other test worker is not): returns the cache file's path."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(kernel_choice, "_others_share", lambda start, end: 0.0)
    for op in kernel_choice.OPERATORS.values():
        monkeypatch.setenv(op.env, "measure")
    monkeypatch.setattr(kernel_choice, "_NATIVE_CHOSEN", {})
    return tmp_path / "aiayn" / "kernels.json"

