"""The Linear kernel chosen per shape by timing (aiayn.inference.kernel_choice): for one row and for several,
cached per machine, the cache obeyed without timing again, the override obeyed, a corrupt cache ignored with
a warning and rebuilt, and a layer taking oneDNN only in the regime where it won."""

import json
import logging

import pytest
import torch
from torch import nn

from aiayn.inference import kernel_choice
from aiayn.inference.precision import PackedLinear, can_pack, pack_linears

pytestmark = pytest.mark.skipif(not can_pack(torch.zeros(2, 2)), reason="this torch build has no oneDNN to pack with")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv(kernel_choice.ENV_VAR, "measure")
    return tmp_path / "aiayn" / "kernels.json"


def three_layers() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 8), nn.Linear(8, 16))


def kinds(model: nn.Module) -> list[str]:
    return [m.rows if isinstance(m, PackedLinear) else "plain" for m in model]


def test_the_faster_kernel_is_kept_per_shape_and_regime_and_cached(cache, monkeypatch, caplog):
    # (in_features, rows) -> (packed ms, plain ms): 8->16 packed wins both; 16->8 only for one row
    timings = {(8, 1): (1.0, 2.0), (8, 8): (1.0, 2.0), (16, 1): (1.0, 2.0), (16, 8): (3.0, 1.0)}
    calls = []
    monkeypatch.setattr(kernel_choice, "_time_both", lambda w, rows: calls.append((w.shape[1], rows)) or timings[(w.shape[1], rows)])
    model = three_layers()
    with caplog.at_level(logging.INFO, logger="aiayn.inference.kernel_choice"):
        assert pack_linears(model) == 3
    assert "8->16 float32 1|8 rows: oneDNN packed 1.000 / 1.000 ms, F.linear 2.000 / 2.000 ms (1 / 8 rows) -> packed" in caplog.text
    assert kinds(model) == ["all", "one", "all"]
    assert sorted(calls) == [(8, 1), (8, 8), (16, 1), (16, 8)]  # the third layer's shape was already decided
    table = json.loads(cache.read_text())
    assert table[kernel_choice.machine_key()] == {"8->16 float32 1|8 rows": "packed", "16->8 float32 1|8 rows": "packed-one-row"}


def test_a_layer_packed_for_one_regime_runs_f_linear_in_the_other(monkeypatch):
    layer = PackedLinear(nn.Linear(8, 4), rows="one")
    packed_calls = []
    monkeypatch.setattr(layer, "packed_forward", lambda x: packed_calls.append(x.shape) or torch.nn.functional.linear(x, layer.weight, layer.bias))
    with torch.no_grad():
        layer(torch.randn(1, 1, 8))
        layer(torch.randn(2, 3, 8))
    assert packed_calls == [(1, 1, 8)]
    with pytest.raises(ValueError, match="rows must be 'all', 'one' or 'many', got 'two'"):
        PackedLinear(nn.Linear(8, 4), rows="two")


def test_a_cached_choice_is_obeyed_without_timing(cache, monkeypatch):
    cache.parent.mkdir(parents=True)
    cache.write_text(json.dumps({kernel_choice.machine_key(): {"8->16 float32 1|8 rows": "plain", "16->8 float32 1|8 rows": "packed-many-rows"}}))
    monkeypatch.setattr(kernel_choice, "_time_both", lambda w, rows: pytest.fail("timed a shape the cache decides"))
    model = three_layers()
    pack_linears(model)
    assert kinds(model) == ["plain", "many", "plain"]
    other = three_layers()
    pack_linears(other)
    assert kinds(other) == kinds(model)  # deterministic given the cache


def test_the_override_is_obeyed_and_an_unknown_one_named(cache, monkeypatch):
    monkeypatch.setattr(kernel_choice, "_time_both", lambda w, rows: pytest.fail("timed under an override"))
    for mode, expected in (("plain", ["plain"] * 3), ("packed", ["all"] * 3)):
        monkeypatch.setenv(kernel_choice.ENV_VAR, mode)
        model = three_layers()
        pack_linears(model)
        assert kinds(model) == expected
    monkeypatch.setenv(kernel_choice.ENV_VAR, "fastest")
    with pytest.raises(ValueError, match=r"\$AIAYN_LINEAR_KERNEL must be one of measure, packed, plain, got 'fastest'"):
        pack_linears(three_layers())


def test_a_corrupt_cache_is_ignored_with_a_warning_and_rebuilt(cache, caplog):
    cache.parent.mkdir(parents=True)
    cache.write_text("{not json")
    with caplog.at_level(logging.WARNING, logger="aiayn.inference.kernel_choice"):
        model = nn.Sequential(nn.Linear(8, 4))
        pack_linears(model)  # real timings of both kernels
    assert "corrupt kernel-choice cache" in caplog.text
    table = json.loads(cache.read_text())
    assert table[kernel_choice.machine_key()]["8->4 float32 1|8 rows"] in kernel_choice.KERNELS
    x = torch.randn(3, 8)
    with torch.no_grad():
        torch.testing.assert_close(model[0](x), torch.nn.functional.linear(x, model[0].weight, model[0].bias))


def test_an_encoder_is_timed_at_its_many_rows(cache, monkeypatch):
    from aiayn import build_model

    seen = set()
    monkeypatch.setattr(kernel_choice, "_time_both", lambda w, rows: seen.add(rows) or (1.0, 2.0))
    pack_linears(build_model("tiny-encoder-only"))
    assert seen == {1, 64}
    seen.clear()
    pack_linears(build_model("tiny-decoder-only"))
    assert seen == {1, 8}
