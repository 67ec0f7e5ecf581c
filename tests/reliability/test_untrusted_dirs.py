"""A model directory is untrusted input: its configs' paths stay inside it, weights are never symlinks,
--overwrite removes only what an export wrote, and every JSON/YAML file is read bounded."""

from __future__ import annotations

import json
import os
import struct
import tracemalloc
import warnings
from pathlib import Path

import pytest
import torch
import yaml
from training_helpers import TinyModel

from aiayn import build_model
from aiayn.checkpoint.directory import CorruptCheckpointWarning, latest_checkpoint
from aiayn.checkpoint.errors import CorruptCheckpointError
from aiayn.checkpoint.state import save_checkpoint
from aiayn.checkpoint.weights import read_safetensors
from aiayn.cli.inference import saved_train_config
from aiayn.cli.main import main
from aiayn.config_io import apply_overrides, load_yaml, save_yaml
from aiayn.interop.hf_dir import read_hf_dir
from aiayn.pretrained import load_pretrained, save_pretrained
from aiayn.tokenization import CharTokenizer
from aiayn.training.config import DataSection, TrainConfig
from aiayn.untrusted import MAX_CONFIG_BYTES, UntrustedInputError

pytestmark = pytest.mark.reliability
DEEP = 100_000


@pytest.fixture(scope="module")
def tokenizer() -> CharTokenizer:
    return CharTokenizer.train(["a cat sat on the mat"])


def _export(path: Path, tokenizer: CharTokenizer) -> Path:
    torch.manual_seed(0)
    return save_pretrained(path, build_model("tiny-decoder-only", vocab_size=tokenizer.vocab_size, max_len=32), tokenizer)


# --------------------------------------------------------------------------- item 2: confinement


def test_a_train_config_path_outside_the_model_directory_is_refused_naming_the_key(tmp_path, tokenizer, capsys):
    model = _export(tmp_path / "m", tokenizer)
    secret = tmp_path / "secret.txt"
    secret.write_text("root:x:0:0:the first line\n")
    inside = model / "val.txt"
    inside.write_text("a cat sat on the mat " * 20)
    config = TrainConfig(data=DataSection(task="lm", dataset="files", train_files=[str(inside)], val_files=[str(secret)],
                                          tokenizer="char", block_size=16))
    save_yaml(config, model / "train_config.yaml")
    assert main(["evaluate", "--checkpoint", str(model), "--split", "val", "--out", str(tmp_path / "e.json")]) == 2
    err = capsys.readouterr().err
    assert f"data.val_files names {str(secret)!r}, which is outside the model directory" in err and "--files" in err
    assert "root:x" not in err  # the file was never opened
    # A relative path is read from inside the directory; the user's own --files are theirs to choose.
    save_yaml(TrainConfig(data=DataSection(task="lm", dataset="files", train_files=["val.txt"], val_files=["val.txt"],
                                           tokenizer="char", block_size=16)), model / "train_config.yaml")
    assert main(["evaluate", "--checkpoint", str(model), "--split", "val", "--out", str(tmp_path / "e.json")]) == 0
    assert main(["evaluate", "--checkpoint", str(model), "--files", str(inside), "--out", str(tmp_path / "f.json")]) == 0
    save_yaml(TrainConfig(data=DataSection(task="lm", dataset="files", train_files=["../secret.txt"], tokenizer="char",
                                           block_size=16)), model / "train_config.yaml")
    assert main(["evaluate", "--checkpoint", str(model), "--split", "val", "--out", str(tmp_path / "e.json")]) == 2
    assert "data.train_files names '../secret.txt', which is outside" in capsys.readouterr().err


def test_the_parent_directory_is_never_consulted_for_the_config(tmp_path, tokenizer):
    model = _export(tmp_path / "m", tokenizer)
    save_yaml(TrainConfig(), tmp_path / "train_config.yaml")  # beside the model, not in it
    assert saved_train_config(model) is None


def test_a_symlinked_weights_file_is_refused_like_a_symlinked_shard(tmp_path, tokenizer):
    model = _export(tmp_path / "m", tokenizer)
    real = tmp_path / "elsewhere.safetensors"
    (model / "model.safetensors").rename(real)
    (model / "model.safetensors").symlink_to(real)
    with pytest.raises(CorruptCheckpointError, match=r"model.safetensors: is a symbolic link"):
        load_pretrained(model)
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}))
    (hf / "model.safetensors").symlink_to(real)  # a single Hugging Face weights file: followed before
    with pytest.raises(CorruptCheckpointError, match=r"model.safetensors: is a symbolic link"):
        read_hf_dir(hf)


# --------------------------------------------------------------------------- item 3: --overwrite


@pytest.mark.parametrize("hidden", ["README.md/thesis.tex", "vocab.txt/deep/data.csv"])
def test_overwrite_never_removes_a_directory_named_like_an_export_file(tmp_path, tokenizer, hidden):
    model = _export(tmp_path / "m", tokenizer)
    work = model / hidden
    work.parent.mkdir(parents=True)
    work.write_text("years of work")
    with pytest.raises(ValueError, match=rf"refusing to replace {model}: "):
        save_pretrained(model, build_model("tiny-decoder-only", vocab_size=tokenizer.vocab_size), overwrite=True)
    assert work.read_text() == "years of work"


def test_overwrite_removes_only_what_the_manifest_lists(tmp_path, tokenizer):
    model = _export(tmp_path / "m", tokenizer)
    listed = json.loads((model / "aiayn_export.json").read_text())["files"]
    assert sorted(listed) == sorted(p.name for p in model.iterdir() if p.name != "aiayn_export.json")
    again = build_model("tiny-decoder-only", vocab_size=tokenizer.vocab_size, max_len=32)
    save_pretrained(model, again, tokenizer, overwrite=True)  # a previous export: replaced
    (model / "README.md").write_text("my notes")  # an export file name, but not written by the export
    with pytest.raises(ValueError, match=r"it holds README.md"):
        save_pretrained(model, again, tokenizer, overwrite=True)
    assert (model / "README.md").read_text() == "my notes"
    (model / "README.md").unlink()
    (model / "config.json").unlink()
    (model / "config.json").symlink_to(tmp_path / "someone-elses.json")  # a link is never followed nor removed
    with pytest.raises(ValueError, match=r"config.json is not a regular file"):
        save_pretrained(model, again, tokenizer, overwrite=True)


# --------------------------------------------------------------------------- item 5: bounded parsing


def test_a_marker_nested_100k_deep_makes_resume_fall_back_to_the_previous_checkpoint(tmp_path):
    model = TinyModel()
    for step in (1, 2):
        save_checkpoint(tmp_path, step=step, model=model, config={"d": 8})
    (tmp_path / "step-000002" / "COMPLETE").write_text("[" * DEEP + "]" * DEEP)
    with pytest.warns(CorruptCheckpointWarning, match=r"step-000002.*nested too deeply"):
        assert latest_checkpoint(tmp_path).name == "step-000001"


def test_deep_configs_and_overrides_are_refused_naming_the_file(tmp_path):
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text('{"a": ' * DEEP + "1" + "}" * DEEP)
    with pytest.raises(UntrustedInputError, match=rf"{hf / 'config.json'}: nested too deeply"):
        read_hf_dir(hf)
    (hf / "config.json").write_text('{"a": ' * 100 + "1" + "}" * 100)  # parses, but deeper than any config
    with pytest.raises(UntrustedInputError, match=r"nested more than 64 levels"):
        read_hf_dir(hf)
    deep_yaml = tmp_path / "deep.yaml"
    deep_yaml.write_text("run_dir: " + "[" * DEEP + "]" * DEEP + "\n")
    with pytest.raises(ValueError, match=rf"{deep_yaml}: nested more than 64 levels deep"):
        load_yaml(deep_yaml, TrainConfig)
    with pytest.raises(ValueError, match=r"override 'run_dir': .*nested more than 64 levels deep"):
        apply_overrides(TrainConfig(), ["run_dir=" + "[" * DEEP + "]" * DEEP])
    laughs = tmp_path / "laughs.yaml"
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"] + [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)]
    laughs.write_text("\n".join(lines) + "\n")
    with pytest.raises(UntrustedInputError, match=r"expands to more than"):
        load_yaml(laughs, TrainConfig)
    assert yaml.safe_load(laughs.read_text())  # plain YAML parses it: the expansion is what is bounded


def _traced(read, path: Path) -> None:
    """Call ``read(path)``, which must raise, having allocated under 1 MiB."""
    tracemalloc.start()
    try:
        read(path)
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert peak < 1 << 20, peak


def test_a_huge_string_in_config_json_is_refused_unread(tmp_path):
    hf = tmp_path / "hf"
    hf.mkdir()
    with open(hf / "config.json", "w") as f:
        f.write('{"architectures": ["GPT2LMHeadModel"], "x": "')
        f.seek(MAX_CONFIG_BYTES + 10)  # sparse: a 16 MB string costs no disk
        f.write('"}')
    with pytest.raises(UntrustedInputError, match=rf"config.json: the config.json is {MAX_CONFIG_BYTES + 12} bytes, over the limit"):
        _traced(read_hf_dir, hf)


def test_a_safetensors_header_claiming_more_than_the_file_fails_before_allocating(tmp_path):
    file = tmp_path / "model.safetensors"
    header = json.dumps({"w": {"dtype": "F32", "shape": [1_600_000_000], "data_offsets": [0, 6_400_000_000]}}).encode()
    file.write_bytes(struct.pack("<Q", len(header)) + header + bytes(16))
    with pytest.raises(CorruptCheckpointError, match=r"tensor 'w': data_offsets \[0, 6400000000\] are outside the data section"):
        _traced(read_safetensors, file)


def test_a_fifo_named_config_json_is_refused_without_blocking(tmp_path, tokenizer):
    hf = tmp_path / "hf"
    hf.mkdir()
    os.mkfifo(hf / "config.json")
    with pytest.raises(UntrustedInputError, match=rf"{hf / 'config.json'}: the config.json is not a regular file \(a FIFO\)"):
        read_hf_dir(hf)
    model = _export(tmp_path / "m", tokenizer)
    (model / "config.json").unlink()
    os.mkfifo(model / "config.json")
    with pytest.raises(UntrustedInputError, match=r"config.json: the model config is not a regular file \(a FIFO\)"):
        load_pretrained(model)


def test_a_tokenizer_without_chars_and_a_labels_list_are_named(tmp_path, tokenizer):
    model = _export(tmp_path / "m", tokenizer)
    data = json.loads((model / "char_tokenizer.json").read_text())
    del data["chars"]
    (model / "char_tokenizer.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match=r"char_tokenizer.json: 'chars' must be a list of single characters, got None"):
        load_pretrained(model)
    model = _export(tmp_path / "m2", tokenizer)
    (model / "labels.json").write_text('["negative", "positive"]')
    with pytest.raises(ValueError, match=r"labels.json: expected a JSON object, got list"):
        load_pretrained(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        (model / "labels.json").write_text('{"labels": ["negative", "positive"]}')
        assert load_pretrained(model).labels == ["negative", "positive"]
