"""CLI input as untrusted: devices that are not there, NaN/inf floats, empty configs; fuzzed parsers."""

from __future__ import annotations

import argparse
import string

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aiayn.cli.args import device, finite_float
from aiayn.cli.main import build_parser, main
from aiayn.config_io import apply_overrides, load_yaml
from aiayn.training.config import TrainConfig

pytestmark = pytest.mark.reliability


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize("command", ["translate", "generate", "fill-mask", "classify", "evaluate"])
def test_cuda_without_cuda_is_a_clear_message(command, capsys):
    extra = ["--split", "test"] if command == "evaluate" else []
    with pytest.raises(SystemExit) as info:
        main([command, "--checkpoint", "nowhere", "--device", "cuda", *extra])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "argument --device: 'cuda': this machine has no usable CUDA device" in err and "Traceback" not in err


@pytest.mark.parametrize("text", ["gpu", "cuda:x", "meta", ""])
def test_unknown_devices_are_refused(text):
    with pytest.raises(argparse.ArgumentTypeError, match="device"):
        device(text)
    assert device("cpu") == "cpu"


@pytest.mark.parametrize(
    ("command", "flag"),
    [("translate", "--length-penalty"), ("evaluate", "--length-penalty"), ("generate", "--temperature"),
     ("generate", "--top-p"), ("generate", "--repetition-penalty"), ("demo", "--minutes")],
)
@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "NaN", "1e999"])
def test_nan_and_inf_floats_are_refused(command, flag, value, capsys):
    argv = [command, f"{flag}={value}"] + ([] if command == "demo" else ["--checkpoint", "x"])
    with pytest.raises(SystemExit):
        build_parser().parse_args(argv)
    assert f"argument {flag}: expected a finite number, got '{value}'" in capsys.readouterr().err


def test_finite_float_accepts_numbers():
    assert finite_float("0.6") == 0.6 and finite_float("-2") == -2.0 and finite_float("1e-3") == 1e-3


@pytest.mark.parametrize("text", ["", "\n", "# only a comment\n", "---\n"])
def test_an_empty_yaml_config_is_refused(tmp_path, text):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=rf"{path}: the config file is empty"):
        load_yaml(path, TrainConfig)


@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf", ".NaN"])
def test_nan_and_inf_in_configs_and_overrides_are_refused(tmp_path, value):
    path = tmp_path / "c.yaml"
    path.write_text(f"optim:\n  lr: {value}\n")
    with pytest.raises(ValueError, match=rf"{path}: optim.lr: expected a finite number"):
        load_yaml(path, TrainConfig)
    with pytest.raises(ValueError, match=r"optim.lr: expected a finite number"):
        apply_overrides(TrainConfig(), [f"optim.lr={value}"])


# --------------------------------------------------------------------------- fuzzing

CONFIG_ERRORS = (ValueError, TypeError)  # what load_yaml and apply_overrides document
KEYS = ["run_dir", "model", "model.d_model", "model.dropout", "model.preset", "optim.lr", "optim.betas", "data",
        "data.task", "data.max_len", "train.max_steps", "train.precision", "train.retention.keep_last", "nope", "train"]
yaml_scalars = st.one_of(
    st.integers(-10**20, 10**20), st.floats(allow_nan=True, allow_infinity=True), st.booleans(), st.none(),
    st.text(max_size=12), st.sampled_from([".nan", "1e-3", "[1, 2]", "{a: 1}", "~", "null", "*a", "&a [*a]", "!!python/object:os.system"]),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(max_size=200))
def test_fuzz_yaml_loader_with_any_text(tmp_path, text):
    path = tmp_path / "c.yaml"
    path.write_bytes(text.encode("utf-8", "surrogatepass"))  # lone surrogates too
    try:
        load_yaml(path, TrainConfig)
    except CONFIG_ERRORS:
        pass


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(entries=st.dictionaries(st.sampled_from(KEYS), yaml_scalars, max_size=5))
def test_fuzz_yaml_loader_with_config_shaped_documents(tmp_path, entries):
    lines = [f"{key}: {value if isinstance(value, str) else repr(value)}" for key, value in entries.items()]
    path = tmp_path / "c.yaml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8", errors="replace")
    try:
        load_yaml(path, TrainConfig)
    except CONFIG_ERRORS:
        pass


@settings(max_examples=200, deadline=None)
@given(overrides=st.lists(st.one_of(
    st.text(max_size=30),
    st.builds(lambda k, v: f"{k}={v}", st.sampled_from(KEYS), st.one_of(st.text(max_size=12), yaml_scalars.map(str))),
), max_size=3))
def test_fuzz_set_overrides(overrides):
    try:
        config = apply_overrides(TrainConfig(), overrides)
    except CONFIG_ERRORS:
        return
    assert isinstance(config, TrainConfig)


_PARSER = build_parser()
TOKENS = ["translate", "generate", "train", "evaluate", "viz", "convert", "--checkpoint", "--device", "--set",
          "--length-penalty", "--temperature", "--top-p", "nan", "-1", "cuda", "cpu", "x", "--", "-v", "--help"]


@settings(max_examples=200, deadline=None)
@given(argv=st.lists(st.one_of(st.sampled_from(TOKENS), st.text(alphabet=string.printable, max_size=8)), max_size=6))
def test_fuzz_the_argument_parser(argv):
    """Parsing only (no command runs): a Namespace or argparse's own exit with status 0 or 2."""
    try:
        _PARSER.parse_args(argv)
    except SystemExit as e:
        assert e.code in (0, 2)
