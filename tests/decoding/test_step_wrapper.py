"""The compiled step's wrapper chosen by timing (aiayn.decoding.step_wrapper): the first steps run each wrapper in turn,
the faster is kept and cached, a later decoder compiles only the cached one, the override is obeyed and a bad one
refused naming the variable, a C++ wrapper that does not build leaves the Python one; and on a real model the tokens
and logits of steps alternating between the two wrappers are the eager step's; and eager decoding never imports
Dynamo."""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from decoding_helpers import gpt, random_rows

from aiayn.decoding import CausalLMDecoder
from aiayn.decoding import step_wrapper as sw
from aiayn.inference import kernel_choice
from aiayn.inference.quantization import avx512_graphs


@pytest.fixture
def cache(tmp_path, monkeypatch):
    path = tmp_path / "kernels.json"
    monkeypatch.setattr(kernel_choice, "cache_path", lambda: path)
    monkeypatch.setattr(kernel_choice, "_others_share", lambda start, end: 0.0)  # a quiet machine (the other test worker is not)
    monkeypatch.setenv(sw.ENV_VAR, "measure")
    return path


class Compiler:
    """Stands for compiled_step: each wrapper's "step" sleeps its own time and says which wrapper ran."""

    def __init__(self, seconds: dict[str, float]) -> None:
        self.seconds, self.compiled, self.ran = seconds, [], []

    def __call__(self, model, options):
        name = "cpp" if options.get("cpp_wrapper") else "python"
        self.compiled.append(name)

        def step(model, tokens, *args):
            self.ran.append(name)
            time.sleep(self.seconds[name])
            return tokens.float()
        return step


def run(step: sw.ChosenStep, calls: int, rows: int = 1) -> None:
    for _ in range(calls):
        step(None, torch.zeros(rows, 1))


MODEL = torch.nn.Linear(2, 2)


def test_the_first_steps_alternate_and_the_faster_wrapper_is_kept_and_cached(cache):
    compiler = Compiler({"python": 0.004, "cpp": 0.001})
    step = sw.ChosenStep(MODEL, compiler)
    run(step, 2 * (sw.TIMED_STEPS + 1) + 3)
    assert compiler.ran[: 2 * (sw.TIMED_STEPS + 1)] == ["python", "cpp"] * (sw.TIMED_STEPS + 1)  # in turn
    assert compiler.ran[-3:] == ["cpp"] * 3 and compiler.compiled == ["python", "cpp"]
    (entry,) = json.loads(cache.read_text()).values()
    assert list(entry.values()) == ["cpp"] and "1 rows (python/cpp)" in next(iter(entry))
    again = Compiler({"python": 0.0, "cpp": 0.0})  # a later decoder on this machine: the cached choice, no timing
    run(sw.ChosenStep(MODEL, again), 3)
    assert again.compiled == ["cpp"] and again.ran == ["cpp"] * 3
    other_batch = Compiler({"python": 0.001, "cpp": 0.004})  # another batch size is its own choice
    run(sw.ChosenStep(MODEL, other_batch), 2 * (sw.TIMED_STEPS + 1) + 1, rows=4)
    assert other_batch.ran[-1] == "python" and len(json.loads(cache.read_text())[kernel_choice.machine_key()]) == 2


@pytest.mark.parametrize("wrapper", sw.WRAPPERS)
def test_the_override_is_obeyed_without_timing(cache, monkeypatch, wrapper):
    monkeypatch.setenv(sw.ENV_VAR, wrapper)
    compiler = Compiler({"python": 0.0, "cpp": 0.0})
    run(sw.ChosenStep(MODEL, compiler), 4)
    assert compiler.compiled == [wrapper] and compiler.ran == [wrapper] * 4 and not cache.exists()


def test_one_candidate_is_taken_without_timing(cache):
    compiler = Compiler({"python": 0.0, "cpp": 0.0})
    run(sw.ChosenStep(MODEL, compiler, ("python",)), 3)  # where Inductor writes AVX2 code
    assert compiler.compiled == ["python"] and not cache.exists()


def test_a_bad_override_is_refused_naming_the_variable(cache, monkeypatch):
    monkeypatch.setenv(sw.ENV_VAR, "c++")
    with pytest.raises(ValueError, match=r"AIAYN_COMPILE_WRAPPER.*'c\+\+'"):
        sw.ChosenStep(MODEL, Compiler({}))


def test_a_cpp_wrapper_that_does_not_build_leaves_the_python_one(cache, caplog):
    class BackendCompilerFailed(RuntimeError):  # the name torch._dynamo gives a failed Inductor compile
        pass

    compiler = Compiler({"python": 0.0, "cpp": 0.0})

    def failing(model, options):
        if options.get("cpp_wrapper"):
            def step(*args):
                raise BackendCompilerFailed("g++: no such file")
            return step
        return compiler(model, options)

    step = sw.ChosenStep(MODEL, failing)
    run(step, 5)
    assert compiler.ran == ["python"] * 5 and "C++ wrapper does not build here" in caplog.text


@pytest.mark.slow
def test_steps_alternating_between_the_wrappers_give_the_eager_logits(cache):
    """Both wrappers of a real compiled step, in turn (the measuring steps), then the one kept: the eager step's logits."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    model = gpt("rotary", n_layers=2)
    compiled, eager = CausalLMDecoder(model, compile=True), CausalLMDecoder(model, static_cache=True)
    assert isinstance(compiled._step, sw.ChosenStep)
    ids = torch.tensor(random_rows([4]))
    steps = 2 * (sw.TIMED_STEPS + 1) + 2
    feed = torch.tensor(random_rows([steps], seed=3)[0])[:, None]
    (state_c, logits_c), (state_e, logits_e) = compiled.start(ids, max_new_tokens=steps), eager.start(ids, max_new_tokens=steps)
    for token in feed:
        torch.testing.assert_close(logits_c, logits_e, rtol=1e-4, atol=1e-4)
        logits_c, logits_e = compiled.step(token, state_c), eager.step(token, state_e)
    torch.testing.assert_close(logits_c, logits_e, rtol=1e-4, atol=1e-4)
    if avx512_graphs():  # else only Inductor's Python wrapper is a candidate, and nothing is timed
        assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 2  # one graph each: not one wrapper's reused
        (entry,) = json.loads(cache.read_text()).values()
        assert list(entry.values())[0] in sw.WRAPPERS  # decided after the timed steps, and cached


def test_eager_decoding_does_not_import_dynamo():
    """Only a step that compiles asks Inductor anything (the wrapper, whether our kernels go in its graphs): importing
    Dynamo costs an eager process 70 MB and 0.9 s."""
    program = """
import sys
sys.path.insert(0, "tests/decoding")
import torch
from decoding_helpers import gpt
from aiayn.decoding import CausalLMDecoder, GenerationConfig, generate
from aiayn.inference import gemv
from aiayn.inference.precision import pack_linears
gemv.available()  # our native library loaded, where it builds
model = gpt("rotary")
pack_linears(model)
generate(CausalLMDecoder(model, static_cache=True), torch.tensor([[1, 2, 3]]), None, GenerationConfig(max_new_tokens=3, greedy=True, eos_id=None))
print("torch._dynamo" in sys.modules)
"""
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", program], cwd=root, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-1] == "False"
