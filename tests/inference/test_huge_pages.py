"""A loaded model's weights on transparent huge pages (aiayn.inference.huge_pages): the same tensors (objects, values,
ties) in new memory, the same logits, layouts derived from them not derived again, checkpoints written as before; the
choice timed once and cached, its overrides, and bad input refused."""

import copy
import json

import pytest
import torch
from torch import nn

from aiayn.decoding import CausalLMDecoder
from aiayn.inference import huge_pages, kernel_choice
from aiayn.inference.huge_pages import huge_page_copies, on_huge_pages, place_on_huge_pages
from aiayn.inference.int4 import Int4Linear
from aiayn.models import build_model
from aiayn.pretrained import load_pretrained, prepare_for_inference, save_pretrained

needs_thp = pytest.mark.skipif(huge_pages.unavailable_reason() is not None, reason=f"{huge_pages.unavailable_reason()}")


@needs_thp
def test_copies_hold_the_same_values_each_in_a_storage_of_its_own():
    tensors = [torch.randn(300, 7), torch.arange(5), torch.randn(3).bfloat16(), torch.zeros(0), torch.tensor([True, False])]
    copies = huge_page_copies(tensors)
    for t, c in zip(tensors, copies):
        assert c.dtype == t.dtype and c.shape == t.shape and torch.equal(c, t)
    placed = [c for c in copies if c.numel()]
    assert all(on_huge_pages(c) and c.data_ptr() % huge_pages.ALIGN == 0 for c in placed)
    assert len({c.untyped_storage().data_ptr() for c in placed}) == len(placed)  # safetensors tells tensors apart by storage
    assert not on_huge_pages(tensors[0])


class Tied(nn.Module):
    """An embedding tied to the output projection, a buffer, and a parameter that is a view of another's storage."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(50, 16)
        self.out = nn.Linear(16, 50, bias=False)
        self.out.weight = self.embed.weight
        self.register_buffer("table", torch.randn(8, 16))
        base = torch.randn(2, 16)
        self.a, self.b = nn.Parameter(base), nn.Parameter(base.view(4, 8))  # each the whole of one storage: moving one would part them


@needs_thp
def test_placing_keeps_the_objects_their_values_and_their_ties_and_places_once():
    model = Tied()
    before = copy.deepcopy(model.state_dict())
    weight, table = model.embed.weight, model.table
    version = weight._version
    moved = place_on_huge_pages(model)
    assert moved == (50 * 16 + 8 * 16) * 4  # the tied weight once; the two views of one storage not at all
    assert model.embed.weight is weight and model.out.weight is weight and model.table is table
    assert on_huge_pages(weight) and on_huge_pages(table) and not on_huge_pages(model.a)
    assert model.a.untyped_storage().data_ptr() == model.b.untyped_storage().data_ptr()
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert weight._version == version  # no in-place change seen by layouts derived from it
    assert place_on_huge_pages(model) == 0


def _gpt():
    torch.manual_seed(0)
    return build_model("tiny-decoder-only", activation="gelu_tanh").eval()


@needs_thp
@pytest.mark.parametrize(("dtype", "quantize"), [(None, None), ("bfloat16", None), (None, "int8"), (None, "int4")])
def test_a_model_on_huge_pages_decodes_the_same_logits(dtype, quantize):
    source = _gpt()
    small = prepare_for_inference(copy.deepcopy(source), dtype=dtype, quantize=quantize, huge_pages=False)
    huge = prepare_for_inference(copy.deepcopy(source), dtype=dtype, quantize=quantize, huge_pages=True)
    assert on_huge_pages(huge.embed.weight) and not on_huge_pages(small.embed.weight)
    ids = torch.randint(1, huge.config.vocab_size, (2, 5))
    for model_kind in (dict(native=True), dict(native=False)):
        logits = []
        for model in (small, huge):
            decoder = CausalLMDecoder(model, static_cache=True, **model_kind)
            state, first = decoder.start(ids, max_new_tokens=4)
            logits.append(torch.stack([first, decoder.step(first.argmax(-1), state), decoder.step(first.argmin(-1), state)]))
        assert torch.equal(logits[0], logits[1])
    for layer in huge.modules():
        if isinstance(layer, Int4Linear):  # the kernel's layout placed with the rest, and not derived again by decoding
            assert on_huge_pages(layer.packed)


@needs_thp
def test_a_model_on_huge_pages_saves_and_loads_as_before(tmp_path):
    model = prepare_for_inference(_gpt(), huge_pages=True)
    save_pretrained(tmp_path / "m", model)
    again = load_pretrained(tmp_path / "m").model
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values()))


@pytest.fixture
def choice(tmp_path, monkeypatch):
    """The huge-page choice of a fresh process, timed against a cache of its own."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(kernel_choice, "_HUGE_PAGES_CHOSEN", [])
    monkeypatch.setattr(kernel_choice, "_others_share", lambda start, end: 0.0)
    monkeypatch.setattr(huge_pages, "unavailable_reason", lambda: None)
    monkeypatch.setattr(kernel_choice, "huge_pages_reason", lambda: None)
    return tmp_path / "aiayn" / "kernels.json"


@pytest.mark.parametrize(("huge", "chosen"), [(0.5, True), (0.99, False), (1.5, False)])
def test_huge_pages_are_kept_where_timed_two_percent_faster_and_the_answer_cached(choice, monkeypatch, huge, chosen):
    monkeypatch.setenv(huge_pages.ENV_VAR, "measure")
    calls = []
    monkeypatch.setattr(kernel_choice, "_time_huge_pages", lambda: calls.append(1) or {"4 KiB pages": 1.0, "huge pages": huge})
    assert kernel_choice.choose_huge_pages() is chosen
    assert kernel_choice._pages() == (", huge pages" if chosen else "")  # the kernels' choices are then timed on those pages
    table = json.loads(choice.read_text())[kernel_choice.machine_key()]
    assert table == {"weights on huge pages (one row, 768->3072 float32, cold, fastest kernel)": "on" if chosen else "off"}
    kernel_choice._HUGE_PAGES_CHOSEN.clear()  # a new process: read from the cache, not timed
    assert kernel_choice.choose_huge_pages() is chosen and len(calls) == 1


@needs_thp
def test_the_placement_is_timed_with_each_kernel_that_reads_the_weight_where_it_lies(monkeypatch):
    """Each placement's time is its fastest kernel's: the kernels a load chooses from, not MKL's alone (which, slower
    than memory on a Zen 4, hid what huge pages give ours); oneDNN's packed copy and the split weight are not placed."""
    monkeypatch.setattr(kernel_choice, "_cold_copies", lambda size: 2)  # a quick timing: what is timed is the point here
    kernels = kernel_choice.huge_page_kernels()
    assert "plain" in kernels and not {"packed", "split"} & set(kernels)
    assert set(kernels) - {"plain"} == (set(kernel_choice.GEMV_KERNELS) if kernel_choice.gemv_available() else set())
    times = kernel_choice._time_huge_pages(rounds=1)
    if times is None:
        pytest.skip("the system gave the timing no huge pages now (memory fragmented)")
    assert set(times) == {"4 KiB pages", "huge pages"} | {f"{where}, {k}" for where in ("4 KiB pages", "huge pages") for k in kernels}
    for where in ("4 KiB pages", "huge pages"):
        assert times[where] == min(times[f"{where}, {k}"] for k in kernels) > 0


def test_a_timing_the_system_gave_no_huge_pages_places_nothing_and_caches_nothing(choice, monkeypatch):
    monkeypatch.setenv(huge_pages.ENV_VAR, "measure")
    monkeypatch.setattr(kernel_choice, "huge_page_bytes", lambda t: 0)  # memory too fragmented for a huge page
    assert kernel_choice.choose_huge_pages() is False and not choice.exists()


@needs_thp
def test_the_system_is_asked_how_much_of_a_mapping_it_made_huge():
    (copy_,) = huge_page_copies([torch.zeros(3 * huge_pages.HUGE_PAGE // 4)])  # 6 MiB: at least two whole huge pages
    assert huge_pages.huge_page_bytes(copy_) in range(0, 8 * huge_pages.HUGE_PAGE, huge_pages.HUGE_PAGE)  # 0 where fragmented
    assert huge_pages.huge_page_bytes(torch.zeros(10)) is not None


@pytest.mark.parametrize(("mode", "chosen"), [("on", True), ("off", False)])
def test_the_override_is_obeyed_without_timing(choice, monkeypatch, mode, chosen):
    monkeypatch.setenv(huge_pages.ENV_VAR, mode)
    monkeypatch.setattr(kernel_choice, "_time_huge_pages", lambda: pytest.fail("timed under an override"))
    assert kernel_choice.choose_huge_pages() is chosen and not choice.exists()


def test_bad_input_is_refused_naming_it(tmp_path, monkeypatch):
    monkeypatch.setattr(kernel_choice, "_HUGE_PAGES_CHOSEN", [])
    monkeypatch.setenv(huge_pages.ENV_VAR, "sometimes")
    with pytest.raises(ValueError, match=r"\$AIAYN_HUGE_PAGES must be one of measure, on, off, got 'sometimes'"):
        kernel_choice.choose_huge_pages()
    with pytest.raises(TypeError, match="huge_pages must be None .* got 'yes'"):
        prepare_for_inference(_gpt(), huge_pages="yes")
    with pytest.raises(TypeError, match="huge_pages must be None .* got 1"):
        prepare_for_inference(_gpt(), huge_pages=1)
    setting = tmp_path / "enabled"
    setting.write_text("always madvise [never]\n")
    monkeypatch.setattr(huge_pages, "SETTING", setting)
    assert "transparent huge pages are off on this machine" in huge_pages.unavailable_reason()
    with pytest.raises(ValueError, match="huge_pages=True: transparent huge pages are off .* use huge_pages=None"):
        prepare_for_inference(_gpt(), huge_pages=True)
    monkeypatch.setenv(huge_pages.ENV_VAR, "on")
    with pytest.raises(ValueError, match=r"\$AIAYN_HUGE_PAGES=on: transparent huge pages are off"):
        kernel_choice.choose_huge_pages()
    monkeypatch.setenv(huge_pages.ENV_VAR, "measure")  # where there are none, measure places nothing
    assert kernel_choice.choose_huge_pages() is False
