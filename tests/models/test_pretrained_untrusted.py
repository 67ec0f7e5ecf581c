"""Untrusted model directories: configs checked against weight headers before allocating; --overwrite confined."""

from __future__ import annotations

import json

import pytest
import torch

from aiayn import build_model
from aiayn.checkpoint.errors import CorruptCheckpointError
from aiayn.pretrained import load_pretrained, save_pretrained

pytestmark = pytest.mark.reliability


def _edit_config(directory, **changes):
    file = directory / "config.json"
    file.write_text(json.dumps({**json.loads(file.read_text()), **changes}))


def test_a_huge_config_is_refused_from_the_header_without_allocating(tmp_path):
    out = save_pretrained(tmp_path / "m", build_model("tiny-decoder-only", vocab_size=40))
    _edit_config(out, d_model=2**30, d_ff=2**30)  # before the fix: a 103 GB allocation
    # Building first would fail in the allocator (RuntimeError) or be killed; the header check comes first.
    with pytest.raises(ValueError, match=r"(?s)shape mismatches .*refusing to build the model of .*config.json: its weights file cannot back it") as info:
        load_pretrained(out)
    assert f"{out / 'model.safetensors'}" in str(info.value) and "1073741824" in str(info.value)


def test_a_config_that_is_not_a_model_config_names_the_file(tmp_path):
    out = save_pretrained(tmp_path / "m", build_model("tiny-decoder-only", vocab_size=40))
    _edit_config(out, n_heads=-3)
    with pytest.raises(ValueError, match=rf"{out / 'config.json'}: not a valid model config \(.*n_heads"):
        load_pretrained(out)
    (out / "config.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match=rf"{out / 'config.json'}: not a valid model config"):
        load_pretrained(out)


def test_a_corrupt_weights_header_is_named_before_building(tmp_path):
    out = save_pretrained(tmp_path / "m", build_model("tiny-decoder-only", vocab_size=40))
    data = bytearray((out / "model.safetensors").read_bytes())
    data[0:8] = (2**40).to_bytes(8, "little")
    (out / "model.safetensors").write_bytes(bytes(data))
    with pytest.raises(CorruptCheckpointError, match=rf"{out / 'model.safetensors'}: header of {2**40} bytes exceeds"):
        load_pretrained(out)


def test_overwrite_replaces_a_previous_export_only(tmp_path):
    model = build_model("tiny-decoder-only", vocab_size=40)
    out = save_pretrained(tmp_path / "m", model)
    save_pretrained(out, model, overwrite=True)  # a previous export: replaced
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "thesis.tex").write_text("years of work")
    with pytest.raises(ValueError, match=rf"refusing to replace {notes}: it is not a previous model export \(it holds thesis.tex\)"):
        save_pretrained(notes, model, overwrite=True)
    assert (notes / "thesis.tex").read_text() == "years of work"
    (out / "my_notes.txt").write_text("keep me")  # an export with someone's file added: kept as well
    with pytest.raises(ValueError, match=r"it holds my_notes.txt"):
        save_pretrained(out, model, overwrite=True)
    (tmp_path / "empty").mkdir()
    save_pretrained(tmp_path / "empty", model, overwrite=True)  # nothing to lose
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match=r"it is not a directory"):
        save_pretrained(tmp_path / "file", model, overwrite=True)


def test_fp16_export_loads_into_the_fp32_model_with_a_logged_cast(tmp_path, caplog):
    model = build_model("tiny-decoder-only", vocab_size=40).half()
    out = save_pretrained(tmp_path / "m", model)
    loaded = load_pretrained(out)
    assert "from torch.float16 to the model's torch.float32" in caplog.text
    assert {p.dtype for p in loaded.model.parameters()} == {torch.float32}
    for (name, a), b in zip(model.state_dict().items(), loaded.model.state_dict().values()):
        assert torch.equal(a.float(), b), name
