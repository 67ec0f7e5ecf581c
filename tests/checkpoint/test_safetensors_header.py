"""checkpoint.safetensors_header: size and entry caps before parsing, bad records named, dtype policy, fuzzing."""

from __future__ import annotations

import json
import logging
import struct
import time
import tracemalloc
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from training_helpers import TinyModel

from aiayn.checkpoint.errors import CorruptCheckpointError
from aiayn.checkpoint.safetensors_header import MAX_ENTRIES, MAX_HEADER_BYTES, read_header
from aiayn.checkpoint.weights import load_state_dict_checked, read_safetensors, state_dict_to_bytes

pytestmark = pytest.mark.reliability


def raw_file(path: Path, header: dict, data: bytes = b"", *, length: int | None = None) -> Path:
    """A safetensors file with exactly this header (no validation on our side)."""
    encoded = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(encoded) if length is None else length) + encoded + data)
    return path


def test_a_valid_file_reads_back(tmp_path: Path) -> None:
    path = tmp_path / "w.safetensors"
    path.write_bytes(state_dict_to_bytes({"a": torch.ones(2, 3), "b": torch.arange(4), "e": torch.zeros(0)}))
    records, _ = read_header(path)
    assert {k: (r.dtype, r.shape) for k, r in records.items()} == {
        "a": (torch.float32, (2, 3)), "b": (torch.int64, (4,)), "e": (torch.float32, (0,))
    }


def _entries(n: int) -> dict:
    return {f"t{i}": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]} for i in range(n)}


def test_a_header_of_100k_entries_is_refused_fast_and_small(tmp_path: Path) -> None:
    path = raw_file(tmp_path / "big.safetensors", _entries(100_000))  # 7.5 MB of header
    started = time.perf_counter()
    with pytest.raises(CorruptCheckpointError, match=rf"{path}: header of \d+ bytes exceeds the limit of {MAX_HEADER_BYTES}"):
        read_safetensors(path)
    assert time.perf_counter() - started < 0.5  # before the fix: 2.2 s and 190 MB, then a load
    tracemalloc.start()
    with pytest.raises(CorruptCheckpointError):
        read_safetensors(path)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 2**20  # the header is never read


def test_too_many_entries_are_refused_before_parsing(tmp_path: Path) -> None:
    path = raw_file(tmp_path / "many.safetensors", _entries(MAX_ENTRIES + 1))
    assert path.stat().st_size < MAX_HEADER_BYTES  # the entry cap is what refuses it
    tracemalloc.start()
    with pytest.raises(CorruptCheckpointError, match=rf"{path}: header lists more than the limit of {MAX_ENTRIES} tensors"):
        read_safetensors(path)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 3 * path.stat().st_size  # the raw header once, never its parsed form


def test_a_header_length_over_the_cap_is_refused_before_reading(tmp_path: Path) -> None:
    path = raw_file(tmp_path / "huge.safetensors", {}, length=2**40)
    with pytest.raises(CorruptCheckpointError, match=rf"{path}: header of {2**40} bytes exceeds the limit of {MAX_HEADER_BYTES}"):
        read_safetensors(path)


F32_4 = {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}


@pytest.mark.parametrize(
    ("header", "message"),
    [
        ({"a": F32_4, "b": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}},
         r"tensor 'b': data_offsets \[8, 16\] overlap tensor 'a'"),
        ({"a": {"dtype": "F32", "shape": [8], "data_offsets": [0, 32]}},
         r"tensor 'a': data_offsets \[0, 32\] are outside the data section \(0 to 16 bytes\)"),
        ({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 16]}},
         r"tensor 'a': shape \[3\] of F32 needs 12 bytes but data_offsets span 16"),
        ({"a": {"dtype": "Q4", "shape": [4], "data_offsets": [0, 16]}}, r"tensor 'a': unknown dtype 'Q4'"),
        ({"a": {"dtype": "F32", "shape": [-4], "data_offsets": [0, 16]}}, r"tensor 'a': shape must be a list of ints >= 0"),
        ({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0]}}, r"tensor 'a': data_offsets must be \[begin, end\]"),
        ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}}, r"tensor 'a': a gap of 8 bytes"),
        ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, r"8 bytes after the last tensor's data"),
        ({"__metadata__": {"k": 3}, "a": F32_4}, r"__metadata__ must map strings to strings"),
        ([1, 2], r"header must be a JSON object, got list"),
    ],
)
def test_bad_records_name_the_file_and_the_tensor(tmp_path: Path, header: object, message: str) -> None:
    path = raw_file(tmp_path / "w.safetensors", header, bytes(16))  # type: ignore[arg-type]
    with pytest.raises(CorruptCheckpointError, match=rf"corrupt checkpoint file {path}: {message}"):
        read_safetensors(path)


def test_a_header_that_is_not_json_is_named(tmp_path: Path) -> None:
    path = tmp_path / "w.safetensors"
    path.write_bytes(struct.pack("<Q", 4) + b"\xff\xfe{[")
    with pytest.raises(CorruptCheckpointError, match=rf"{path}: header is not valid JSON"):
        read_safetensors(path)


# --------------------------------------------------------------------------- dtype policy


def _state_file(tmp_path: Path, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    path = tmp_path / "w.safetensors"
    path.write_bytes(state_dict_to_bytes(state))
    return read_safetensors(path)[0]


def test_fp16_weights_are_cast_into_an_fp32_model_and_the_cast_is_logged(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    source = TinyModel(tied=False)
    state = {k: (v.half() if v.is_floating_point() else v) for k, v in source.state_dict().items()}
    target = TinyModel(tied=False)
    with caplog.at_level(logging.WARNING, logger="aiayn.checkpoint.weights"):
        load_state_dict_checked(target, _state_file(tmp_path, state), source="w.safetensors")
    assert "w.safetensors: cast 6 tensor(s) from torch.float16 to the model's torch.float32" in caplog.text
    assert target.proj.weight.dtype == torch.float32
    assert torch.equal(target.proj.weight, source.proj.weight.half().float())


def test_integer_weights_are_refused_by_a_float_model(tmp_path: Path) -> None:
    state = dict(TinyModel().state_dict())
    state["proj.weight"] = torch.ones(8, 8, dtype=torch.int64)
    state["counter"] = torch.zeros((), dtype=torch.float32)  # float into the int64 buffer: refused as well
    with pytest.raises(ValueError, match=r"dtype mismatches .*\(2\): counter: file torch.float32, model torch.int64, "
                                         r"proj.weight: file torch.int64, model torch.float32"):
        load_state_dict_checked(TinyModel(), _state_file(tmp_path, state), source="w.safetensors")


# --------------------------------------------------------------------------- fuzzing

_OK = (CorruptCheckpointError,)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(blob=st.binary(max_size=200))
def test_fuzz_random_bytes_give_only_corrupt_checkpoint_errors(tmp_path: Path, blob: bytes) -> None:
    path = tmp_path / "fuzz.safetensors"
    path.write_bytes(blob)
    try:
        read_safetensors(path)
    except _OK:
        pass


_record = st.fixed_dictionaries({
    "dtype": st.sampled_from(["F32", "F16", "I64", "BOOL", "U8", "X9", 3]),
    "shape": st.one_of(st.lists(st.integers(-2, 6), max_size=3), st.just("4")),
    "data_offsets": st.lists(st.integers(-4, 80), min_size=0, max_size=3),
})


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(header=st.dictionaries(st.text(max_size=4), _record, max_size=4), data=st.binary(max_size=64),
       length_delta=st.integers(-3, 3))
def test_fuzz_headers_with_random_lengths_and_offsets(tmp_path: Path, header: dict, data: bytes, length_delta: int) -> None:
    encoded = json.dumps(header).encode()
    path = tmp_path / "fuzz.safetensors"
    path.write_bytes(struct.pack("<Q", max(0, len(encoded) + length_delta)) + encoded + data)
    try:
        tensors, _ = read_safetensors(path)
    except _OK:
        return
    records, _ = read_header(path)  # whatever loads must match its checked header exactly
    assert {k: (t.dtype, tuple(t.shape)) for k, t in tensors.items()} == {k: (r.dtype, r.shape) for k, r in records.items()}
