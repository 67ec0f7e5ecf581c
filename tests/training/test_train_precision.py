"""train.precision: auto picks bf16 only where bf16 matmuls are native; a named precision is obeyed."""

from __future__ import annotations

import logging

import pytest
import torch
from loop_fixtures import lm_config

from aiayn.inference.precision import native_bf16, parse_dtype
from aiayn.training import precision as precision_module
from aiayn.training.config import LoopSection
from aiayn.training.loop import train
from aiayn.training.precision import autocast_context, resolve_precision

CPU = torch.device("cpu")


@pytest.mark.parametrize(("native", "expected"), [(True, "bfloat16"), (False, "float32")])
def test_auto_follows_the_hardware(monkeypatch, native, expected):
    monkeypatch.setattr(precision_module, "native_bf16", lambda device: native)
    assert resolve_precision("auto", CPU) == expected


@pytest.mark.parametrize(("named", "name"), [("fp32", "float32"), ("bf16", "bfloat16"), ("fp16", "float16"),
                                             ("float32", "float32"), ("bfloat16", "bfloat16"), ("float16", "float16")])
def test_a_named_precision_is_obeyed_in_either_spelling(monkeypatch, named, name):
    """One vocabulary: inference's names everywhere, training's short ones as their aliases."""
    monkeypatch.setattr(precision_module, "native_bf16", lambda device: True)
    assert LoopSection(precision=named).precision == named  # the config keeps what was written
    assert resolve_precision(named, CPU) == name
    assert parse_dtype(named) == getattr(torch, name)


def test_every_inference_flag_takes_the_short_names_too():
    import argparse

    from aiayn.cli.inference import add_precision_arguments
    from aiayn.cli.serve import add_arguments

    for add in (add_precision_arguments, add_arguments):
        parser = argparse.ArgumentParser()
        add(parser)
        args = parser.parse_args(["--dtype", "bf16"] + (["--checkpoint", "x"] if add is add_arguments else []))
        assert parse_dtype(args.dtype) == torch.bfloat16


def test_bf16_without_native_support_warns_and_runs(monkeypatch, caplog):
    monkeypatch.setattr(precision_module, "native_bf16", lambda device: False)
    with caplog.at_level(logging.WARNING, logger="aiayn.training.precision"):
        assert resolve_precision("bf16", CPU) == "bfloat16"
    assert "train.precision=bf16" in caplog.text and "train.precision=auto" in caplog.text


def test_native_bf16_answers_from_the_cpu_flags(monkeypatch):
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    assert native_bf16(CPU) is False
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True)
    assert native_bf16(CPU) is True


def test_autocast_context_sets_the_dtype():
    with autocast_context("bfloat16", CPU)():
        assert torch.get_autocast_dtype("cpu") == torch.bfloat16 and torch.is_autocast_enabled("cpu")
    with autocast_context("float32", CPU)():
        assert not torch.is_autocast_enabled("cpu")


def test_an_unknown_precision_is_refused_naming_the_field():
    with pytest.raises(ValueError, match=r"train\.precision.*'bf17'.*auto"):
        LoopSection(precision="bf17")


def test_a_run_with_auto_precision_trains_and_says_what_it_chose(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(precision_module, "native_bf16", lambda device: False)
    config = lm_config(tmp_path, steps=2)
    config.train.precision = "auto"
    with caplog.at_level(logging.INFO, logger="aiayn.training.loop"):
        result = train(config)
    assert result.step == 2 and "train.precision=auto: float32 on this cpu" in caplog.text
