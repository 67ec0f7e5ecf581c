"""The Linear kernels chosen per shape by timing (aiayn.inference.kernel_choice): for one row and for several,
cached per machine, the cache obeyed without timing again, the override obeyed, a corrupt cache ignored with
a warning and rebuilt, and a layer taking each kernel only in the regime where it won."""

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
    monkeypatch.setattr(kernel_choice, "_others_share", lambda start, end: 0.0)  # a quiet machine (the other test worker is not)
    monkeypatch.setenv(kernel_choice.ENV_VAR, "measure")
    monkeypatch.setattr(kernel_choice, "gemv_available", lambda: False)  # the three library kernels (native: its own test)
    return tmp_path / "aiayn" / "kernels.json"


def three_layers() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 8), nn.Linear(8, 16))


def kinds(model: nn.Module) -> list[str]:
    return [f"{m.one}/{m.many}" if isinstance(m, PackedLinear) else "plain/plain" for m in model]


def test_the_faster_kernel_is_kept_per_shape_and_regime_and_cached(cache, monkeypatch, caplog):
    # (in_features, rows) -> ms of each kernel: 8->16 packed wins both; 16->8 split for one row, F.linear for 8
    timings = {(8, 1): {"plain": 2.0, "packed": 1.0, "split": 3.0}, (8, 8): {"plain": 2.0, "packed": 1.0},
               (16, 1): {"plain": 2.0, "packed": 1.5, "split": 1.0}, (16, 8): {"plain": 1.0, "packed": 3.0}}
    calls = []

    def timed(w, rows, names, group=0):
        calls.append((w.shape[1], rows))
        assert tuple(timings[(w.shape[1], rows)]) == names
        return timings[(w.shape[1], rows)]

    monkeypatch.setattr(kernel_choice, "_time_kernels", timed)
    model = three_layers()
    with caplog.at_level(logging.INFO, logger="aiayn.inference.kernel_choice"):
        assert pack_linears(model) == 3
    assert ("8->16 float32 1|8 rows, ours to 8, prefetch first: plain 2.000, packed 1.000, split 3.000 ms (1 row); plain 2.000, packed 1.000 ms (8 rows) "
            "-> packed/packed") in caplog.text
    assert kinds(model) == ["packed/packed", "split/plain", "packed/packed"]
    assert sorted(calls) == [(8, 1), (8, 8), (16, 1), (16, 8)]  # the third layer's shape was already decided
    table = json.loads(cache.read_text())
    assert table[kernel_choice.machine_key()] == {"8->16 float32 1|8 rows, ours to 8, prefetch first": "packed/packed", "16->8 float32 1|8 rows, ours to 8, prefetch first": "split/plain"}


@pytest.mark.parametrize("fastest", ["native", "native-prefetch"])
def test_the_native_kernel_is_timed_for_fp32_where_it_builds_and_a_stale_choice_of_it_timed_again(fastest, native_gemv, cache,
                                                                                                    monkeypatch):
    monkeypatch.setattr(kernel_choice, "gemv_available", lambda: True)
    names_timed = []

    def timed(w, rows, names, group=0):
        names_timed.append((w.dtype, rows, names))
        return {n: {fastest: 1.0, "packed": 2.0}.get(n, 3.0) for n in names}

    monkeypatch.setattr(kernel_choice, "_time_kernels", timed)
    model = three_layers()
    pack_linears(model)
    assert kinds(model) == [f"{fastest}/{fastest}"] * 3  # one row and eight rows
    native = ("plain", "packed", "split", "native", "native-prefetch")
    assert (torch.float32, 1, native) in names_timed
    assert (torch.float32, 8, ("plain", "packed", "native", "native-prefetch")) in names_timed
    assert kernel_choice.one_row_kernels(torch.bfloat16) == native
    assert kernel_choice.one_row_kernels(torch.float16) == ("plain", "packed", "split")  # not a candidate
    assert kernel_choice.many_row_kernels(torch.float32, 9) == ("plain", "packed")  # more rows than it takes
    names_timed.clear()
    monkeypatch.setattr(kernel_choice, "gemv_available", lambda: False)  # e.g. the compiler is gone: the cached choice is stale
    other = three_layers()
    pack_linears(other)
    assert kinds(other) == ["packed/packed"] * 3
    assert (torch.float32, 1, ("plain", "packed", "split")) in names_timed
    assert (torch.float32, 8, ("plain", "packed")) in names_timed


def test_int8_layers_take_the_faster_kernel_of_one_row_and_of_a_few_cached_and_the_override_takes_torchs(native_gemv, cache, monkeypatch):
    from aiayn.inference.quantization import quantize_int8

    monkeypatch.setattr(kernel_choice, "gemv_available", lambda: True)
    timed = []

    def fake_times(w, rows, names, group=0, rounds=7):  # one row: native wins the 8 -> 16 shape; eight rows: torch wins it
        timed.append((w.dtype, rows, names))
        slow = (w.shape[0] == 16) == (rows == 1)
        return {"torch": 2.0 if slow else 1.0, "native": 1.5, "native-prefetch": 1.4 if rows > 1 else 1.6, "dequant": 3.0}

    monkeypatch.setattr(kernel_choice, "_time_kernels", fake_times)
    model = quantize_int8(three_layers())
    pack_linears(model)
    assert [(m.one, m.many) for m in model] == [("native", "torch"), ("torch", "native-prefetch"), ("native", "torch")]
    assert [t for t in timed if t[2] != kernel_choice.PROMPT_TIMED] == [(torch.int8, rows, ("torch", "native", "native-prefetch")) for _ in range(2) for rows in (1, 8)]
    assert json.loads(cache.read_text())[kernel_choice.machine_key()]["8->16 int8 weight-only 1|8 rows, prefetch first, ours first"] == "native/torch"
    monkeypatch.setattr(kernel_choice, "_time_kernels", lambda w, rows, names, group=0, rounds=7: pytest.fail("timed a shape the cache decides"))
    again = quantize_int8(three_layers())
    pack_linears(again)
    assert [(m.one, m.many) for m in again] == [("native", "torch"), ("torch", "native-prefetch"), ("native", "torch")]
    monkeypatch.setenv(kernel_choice.ENV_VAR, "packed")
    pack_linears(again)
    assert [(m.one, m.many) for m in again] == [("torch", "torch")] * 3


def test_prompts_take_the_widened_weight_above_the_rows_where_it_was_timed_faster_where_bf16_is_native(cache, monkeypatch):
    """A prompt's rows through an int8 or int4 layer: torch's kernel, or the widened weight above the rows of the first
    row count of PROMPT_LADDER it was timed faster at, timed once per shape and cached; torch's, untimed, on a CPU
    without native bf16 matmuls and under any override."""
    from aiayn.inference import precision
    from aiayn.inference.int4 import quantize_int4
    from aiayn.inference.quantization import quantize_int8

    timed = []

    def fake_times(w, rows, names, group=0, rounds=7):  # int8: widened faster at 64 rows for 8 -> 16 only; int4: at 256 only
        timed.append((tuple(w.shape), group, rows, names))
        wins = (w.shape[0] == 16) if not group else rows == 256
        return {"torch": 1.0, "native": 0.5, "native-prefetch": 0.5, "dequant": 0.5 if wins else 2.0}

    monkeypatch.setattr(kernel_choice, "_time_kernels", fake_times)
    monkeypatch.setattr(kernel_choice, "native_bf16", lambda device: True)
    model = quantize_int8(three_layers())
    precision.choose_quantized_kernels(model)
    assert [m.prompt for m in model] == ["dequant", "torch", "dequant"]
    prompts = [t for t in timed if t[3] == kernel_choice.PROMPT_TIMED]
    assert prompts == [((16, 8), 0, 64, ("torch", "dequant")), *[((8, 16), 0, rows, ("torch", "dequant")) for rows in (64, 128, 256)]]
    assert json.loads(cache.read_text())[kernel_choice.machine_key()]["8->16 int8 weight-only prompt 64|128|256 rows"] == "dequant"
    int4 = quantize_int4(nn.Sequential(nn.Linear(64, 32)), 32)
    precision.choose_quantized_kernels(int4)
    assert int4[0].prompt == "dequant-long" and timed[-3:] == [((32, 32), 32, rows, ("torch", "dequant")) for rows in (64, 128, 256)]
    monkeypatch.setattr(kernel_choice, "_time_kernels", lambda *a, **k: pytest.fail("timed a shape the cache decides"))
    again = quantize_int8(three_layers())
    precision.choose_quantized_kernels(again)
    assert [m.prompt for m in again] == ["dequant", "torch", "dequant"]
    weights = [m.weight for m in again]
    monkeypatch.setattr(kernel_choice, "native_bf16", lambda device: False)  # a bf16 matmul is a generic loop there
    assert kernel_choice.choose_prompt_kernels(weights, [0] * 3) == ["torch"] * 3
    monkeypatch.setattr(kernel_choice, "native_bf16", lambda device: True)
    monkeypatch.setenv(kernel_choice.ENV_VAR, "packed")
    assert kernel_choice.choose_prompt_kernels(weights, [0] * 3) == ["torch"] * 3


def test_int4_layers_take_the_faster_kernel_timed_on_their_codes_and_group_cached_and_the_override_takes_torchs(cache, monkeypatch):
    from aiayn.inference.int4 import quantize_int4

    monkeypatch.setattr(kernel_choice, "gemv_available", lambda: True)
    timed = []

    def fake_times(w, rows, names, group=0, rounds=7):  # one row: ours wins the 64 -> 32 shape; eight rows: torch wins both
        timed.append((w.dtype, tuple(w.shape), group, rows, names))
        return {"torch": 1.0 if rows > 1 or w.shape[0] == 64 else 2.0, "native": 1.5, "native-prefetch": 1.45, "dequant": 3.0}

    def two_layers() -> nn.Module:
        return nn.Sequential(nn.Linear(64, 32), nn.Linear(32, 64))

    monkeypatch.setattr(kernel_choice, "_time_kernels", fake_times)
    model = quantize_int4(two_layers(), 32)
    pack_linears(model)
    assert [(m.one, m.many) for m in model] == [("native-prefetch", "torch"), ("torch", "torch")]
    # timed on the codes as the layer holds them (uint8, two to a byte) with the group size
    assert [t for t in timed if t[4] != kernel_choice.PROMPT_TIMED] == [(torch.uint8, shape, 32, rows, ("torch", "native", "native-prefetch"))
                                                                      for shape in ((32, 32), (64, 16)) for rows in (1, 8)]
    assert json.loads(cache.read_text())[kernel_choice.machine_key()]["64->32 int4 g32 weight-only 1|8 rows, prefetch first, ours first, vector inputs, steps in registers"] == "native-prefetch/torch"
    monkeypatch.setattr(kernel_choice, "_time_kernels", lambda *a, **k: pytest.fail("timed a shape the cache decides"))
    again = quantize_int4(two_layers(), 32)
    pack_linears(again)
    assert [(m.one, m.many) for m in again] == [("native-prefetch", "torch"), ("torch", "torch")]
    monkeypatch.setenv(kernel_choice.ENV_VAR, "plain")
    pack_linears(again)
    assert [(m.one, m.many) for m in again] == [("torch", "torch")] * 2


def test_packed_is_kept_only_when_3_percent_faster():
    assert kernel_choice._fastest({"plain": 1.0, "packed": 0.98}) == "plain"  # not worth a second copy of the weight
    assert kernel_choice._fastest({"plain": 1.0, "packed": 0.96, "split": 0.97}) == "split"
    assert kernel_choice._fastest({"plain": 1.0, "packed": 0.96, "split": 0.999}) == "packed"


def test_ours_without_prefetching_is_kept_only_when_3_percent_faster_than_with_it():
    assert kernel_choice._fastest({"native": 0.98, "native-prefetch": 1.0}) == "native-prefetch"  # within the noise
    assert kernel_choice._fastest({"native": 0.96, "native-prefetch": 1.0, "plain": 1.1}) == "native"
    assert kernel_choice._fastest({"torch": 1.0, "native": 0.99}) == "native"  # no prefetching candidate: as timed
    assert kernel_choice._fastest({"plain": 0.99, "native": 0.98, "native-prefetch": 1.0}) == "plain"


def test_torchs_weight_only_kernel_is_kept_only_when_3_percent_faster_than_ours():
    assert kernel_choice._fastest({"torch": 0.98, "native": 1.1, "native-prefetch": 1.0}) == "native-prefetch"  # within the noise
    assert kernel_choice._fastest({"torch": 0.96, "native": 1.1, "native-prefetch": 1.0}) == "torch"
    assert kernel_choice._fastest({"torch": 0.98, "native": 0.99, "native-prefetch": 1.0}) == "native-prefetch"


def test_a_layer_runs_each_regime_through_its_own_kernel(monkeypatch):
    layer = PackedLinear(nn.Linear(8, 4), one="packed", many="plain")
    packed_calls = []
    monkeypatch.setattr(layer, "packed_forward", lambda x: packed_calls.append(x.shape) or torch.nn.functional.linear(x, layer.weight, layer.bias))
    with torch.no_grad():
        layer(torch.randn(1, 1, 8))
        layer(torch.randn(2, 3, 8))
    assert packed_calls == [(1, 1, 8)]
    split = PackedLinear(nn.Linear(8, 5), one="split", many="packed")  # 5 rows: slices and a rest
    assert split._packed is not None and PackedLinear(nn.Linear(8, 5), one="split", many="plain")._packed is None
    for x in (torch.randn(1, 1, 8), torch.randn(3, 8)):
        with torch.no_grad():
            torch.testing.assert_close(split(x), torch.nn.functional.linear(x, split.weight, split.bias))
    with pytest.raises(ValueError, match="PackedLinear: one must be one of plain, packed, split, native, native-prefetch, got 'two'"):
        PackedLinear(nn.Linear(8, 4), one="two")
    with pytest.raises(ValueError, match="PackedLinear: many must be one of plain, packed, native, native-prefetch, got 'split'"):
        PackedLinear(nn.Linear(8, 4), many="split")


def test_a_cached_choice_is_obeyed_without_timing(cache, monkeypatch):
    cache.parent.mkdir(parents=True)
    cache.write_text(json.dumps({kernel_choice.machine_key(): {"8->16 float32 1|8 rows, ours to 8, prefetch first": "plain/plain", "16->8 float32 1|8 rows, ours to 8, prefetch first": "split/packed"}}))
    monkeypatch.setattr(kernel_choice, "_time_kernels", lambda w, rows, names, group=0: pytest.fail("timed a shape the cache decides"))
    model = three_layers()
    pack_linears(model)
    assert kinds(model) == ["plain/plain", "split/packed", "plain/plain"]
    other = three_layers()
    pack_linears(other)
    assert kinds(other) == kinds(model)  # deterministic given the cache


def test_a_choice_of_an_older_cache_format_is_timed_again(cache, monkeypatch):
    cache.parent.mkdir(parents=True)
    cache.write_text(json.dumps({kernel_choice.machine_key(): {"8->4 float32 1|8 rows, ours to 8, prefetch first": "packed-one-row"}}))
    monkeypatch.setattr(kernel_choice, "_time_kernels", lambda w, rows, names, group=0: {n: 2.0 if n == "packed" else 1.0 for n in names})
    model = nn.Sequential(nn.Linear(8, 4))
    pack_linears(model)
    assert kinds(model) == ["plain/plain"]
    assert json.loads(cache.read_text())[kernel_choice.machine_key()] == {"8->4 float32 1|8 rows, ours to 8, prefetch first": "plain/plain"}


def test_the_override_is_obeyed_and_an_unknown_one_named(cache, monkeypatch):
    monkeypatch.setattr(kernel_choice, "_time_kernels", lambda w, rows, names, group=0: pytest.fail("timed under an override"))
    for mode, expected in (("plain", ["plain/plain"] * 3), ("packed", ["packed/packed"] * 3), ("split", ["split/plain"] * 3)):
        monkeypatch.setenv(kernel_choice.ENV_VAR, mode)
        model = three_layers()
        pack_linears(model)
        assert kinds(model) == expected
    monkeypatch.setenv(kernel_choice.ENV_VAR, "fastest")
    with pytest.raises(ValueError, match=r"\$AIAYN_LINEAR_KERNEL must be one of measure, packed, plain, split, got 'fastest'"):
        pack_linears(three_layers())


def test_a_corrupt_cache_is_ignored_with_a_warning_and_rebuilt(cache, caplog):
    cache.parent.mkdir(parents=True)
    cache.write_text("{not json")
    with caplog.at_level(logging.WARNING, logger="aiayn.inference.kernel_choice"):
        model = nn.Sequential(nn.Linear(8, 4))
        pack_linears(model)  # real timings of both kernels
    assert "corrupt kernel-choice cache" in caplog.text
    table = json.loads(cache.read_text())
    assert table[kernel_choice.machine_key()]["8->4 float32 1|8 rows, ours to 8, prefetch first"] in kernel_choice.KERNELS
    x = torch.randn(3, 8)
    with torch.no_grad():
        torch.testing.assert_close(model[0](x), torch.nn.functional.linear(x, model[0].weight, model[0].bias))


def test_an_encoder_is_timed_at_its_many_rows(cache, monkeypatch):
    from aiayn import build_model

    seen = set()
    monkeypatch.setattr(kernel_choice, "_time_kernels", lambda w, rows, names, group=0: seen.add(rows) or dict.fromkeys(names, 1.0))
    pack_linears(build_model("tiny-encoder-only"))
    assert seen == {1, 64}
    seen.clear()
    pack_linears(build_model("tiny-decoder-only"))
    assert seen == {1, 8}


def test_decoding_through_split_kernels_gives_plain_decodings_tokens(cache, monkeypatch):
    """A decoder-only model whose one-row calls are split over the threads (and whose prompt goes through oneDNN)
    generates, greedy, the tokens of the same model through F.linear everywhere; its logits agree to fp32 rounding."""
    import copy

    from aiayn import build_model
    from aiayn.decoding import CausalLMDecoder, GenerationConfig, generate
    from aiayn.pretrained import prepare_for_inference

    torch.manual_seed(0)
    model = build_model("tiny-decoder-only", vocab_size=50, bias=True)
    monkeypatch.setattr(kernel_choice, "_time_kernels", lambda w, rows, names, group=0: {n: {"split": 1.0, "packed": 2.0}.get(n, 3.0) for n in names})
    split = prepare_for_inference(copy.deepcopy(model))
    monkeypatch.setenv(kernel_choice.ENV_VAR, "plain")
    plain = prepare_for_inference(copy.deepcopy(model))
    layers = [m for m in split.modules() if isinstance(m, PackedLinear)]
    assert layers and all((m.one, m.many) == ("split", "packed") for m in layers)
    assert not any(isinstance(m, PackedLinear) for m in plain.modules())
    prompt = torch.randint(4, 50, (1, 5))
    config = GenerationConfig(max_new_tokens=12, greedy=True, eos_id=None)
    outs = [generate(CausalLMDecoder(m, static_cache=True), prompt, None, config) for m in (split, plain)]
    assert outs[0].sequences() == outs[1].sequences()
    with torch.no_grad():
        torch.testing.assert_close(split(prompt[:, :1]), plain(prompt[:, :1]), rtol=1e-5, atol=1e-5)


def test_a_choice_timed_while_other_work_ran_is_used_but_not_cached(cache, monkeypatch, caplog):
    """Another process on a core slows a kernel of two threads and not one of one: such a timing picks wrongly (a
    768 -> 768 fp32 layer cached as F.linear ran at 100 us a token where oneDNN takes 60), so it is not kept."""
    monkeypatch.setattr(kernel_choice, "_time_kernels", lambda w, rows, names, group=0: {n: 2.0 if n == "packed" else 1.0 for n in names})
    monkeypatch.setattr(kernel_choice, "_others_share", lambda start, end: 0.6)
    model = nn.Sequential(nn.Linear(8, 4))
    with caplog.at_level(logging.WARNING, logger="aiayn.inference.kernel_choice"):
        pack_linears(model)
    assert kinds(model) == ["plain/plain"] and not cache.exists()
    assert "timed while other work took 60% of a core" in caplog.text and "timed again at the next load" in caplog.text
    monkeypatch.setattr(kernel_choice, "_others_share", lambda start, end: 0.0)
    pack_linears(nn.Sequential(nn.Linear(8, 4)))  # quiet now: timed again and kept
    assert json.loads(cache.read_text())[kernel_choice.machine_key()] == {"8->4 float32 1|8 rows, ours to 8, prefetch first": "plain/plain"}


def test_other_work_is_measured_from_proc_stat():
    """Another process spinning on a core is seen."""
    import subprocess
    import sys
    import time

    if kernel_choice.cpu_seconds() is None:
        pytest.skip("no /proc/stat here (not Linux): other work is not measured")
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.2)
        start = kernel_choice.cpu_seconds()
        time.sleep(0.4)
        other = kernel_choice._others_share(start, kernel_choice.cpu_seconds())
    finally:
        spinner.kill()
    assert other > 0.5


def test_pinned_choices_are_obeyed_over_the_cache_recorded_and_refused_from_another_machine(cache, monkeypatch, caplog):
    """A resumed training run computes with the kernels its checkpoint recorded (choices_made -> pin_choices), whatever
    the cache says now (a choice timed while other work ran is not cached, and may come out otherwise next time)."""
    monkeypatch.setattr(kernel_choice, "_PINNED", {})
    monkeypatch.setattr(kernel_choice, "_MADE", {})
    shape = "8->4 float32 1|8 rows, ours to 8, prefetch first"
    cache.parent.mkdir(parents=True)
    cache.write_text(json.dumps({kernel_choice.machine_key(): {shape: "plain/plain"}}))
    monkeypatch.setattr(kernel_choice, "_time_kernels", lambda w, rows, names, group=0: pytest.fail("timed a decided shape"))
    record = {"machine": kernel_choice.machine_key(), "choices": {shape: "split/packed"}}
    assert kernel_choice.pin_choices(record, "step-000004")
    model = nn.Sequential(nn.Linear(8, 4))
    pack_linears(model)
    assert kinds(model) == ["split/packed"]
    assert kernel_choice.choices_made() == record  # what a checkpoint of this run records
    assert json.loads(cache.read_text())[kernel_choice.machine_key()] == {shape: "plain/plain"}  # the cache keeps its own

    with caplog.at_level(logging.WARNING, logger="aiayn.inference.kernel_choice"):
        assert not kernel_choice.pin_choices({**record, "machine": "another CPU"}, "step-000004")
    assert "chose its kernels on another machine" in caplog.text
    other = nn.Sequential(nn.Linear(8, 4))
    pack_linears(other)
    assert kinds(other) == ["plain/plain"]  # this machine's own (the cache's)
    kernel_choice.pin_choices(record)
    kernel_choice.pin_choices(None)  # a run that does not resume unpins
    pack_linears(third := nn.Sequential(nn.Linear(8, 4)))
    assert kinds(third) == ["plain/plain"]
    with pytest.raises(ValueError, match="step-000004: kernels must be"):
        kernel_choice.pin_choices({"machine": 3}, "step-000004")
