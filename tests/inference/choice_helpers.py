"""Checks the tests of the native operators' timed choice share (aiayn.inference.kernel_choice)."""

import json

import pytest
import torch

from aiayn.inference import kernel_choice


def assert_choice_cached(monkeypatch, cache, op: str, choose) -> None:
    """After a first choice of ``op`` timed ``native`` for fp32: the cache holds it, and a new process's choice reads it
    without timing; an override that is no kernel's name is refused, naming the variable."""
    assert json.loads(cache.read_text())[kernel_choice.machine_key()] == {f"{op} float32 (torch/native)": "native"}
    kernel_choice._NATIVE_CHOSEN.clear()
    spec = kernel_choice.OPERATORS[op]
    monkeypatch.setattr(kernel_choice, spec.timer, lambda dtype: pytest.fail("timed a dtype the cache decides"))
    assert choose(torch.float32) == "native"
    kernel_choice._NATIVE_CHOSEN.clear()
    monkeypatch.setenv(spec.env, "fast")
    with pytest.raises(ValueError, match=rf"\${spec.env} must be one of measure, torch, native, got 'fast'"):
        choose(torch.float32)
    kernel_choice._NATIVE_CHOSEN.clear()
    monkeypatch.setenv(spec.env, "measure")
