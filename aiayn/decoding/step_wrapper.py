"""The compiled decode step's wrapper, chosen by timing: Inductor's Python wrapper or its C++ one (``cpp_wrapper``).

A compiled step calls a few dozen kernels a token, and the code that calls them costs a share of the token that
depends on the CPU: on an AMX Xeon the C++ wrapper made GPT-2-small's fp32 and bf16 steps 1.05x faster, on a Zen 5
EPYC it gained nothing (docs/benchmarks.md). So a decoder that compiles runs its first steps with each wrapper in
turn (:data:`TIMED_STEPS` each, after the one that compiles it), keeps the faster, and caches the answer beside the
kernel choices (:mod:`aiayn.inference.kernel_choice`, per CPU, torch version and thread count): a later decoder on
this machine compiles only the one kept. Both wrappers call the same generated kernels, so the tokens do not depend
on which ran. ``$AIAYN_COMPILE_WRAPPER``: ``measure`` (the default), ``python`` or ``cpp``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from torch import Tensor, nn

from aiayn.environment import env_choice
from aiayn.inference import kernel_choice

__all__ = ["ENV_VAR", "TIMED_STEPS", "WRAPPERS", "ChosenStep", "wrapper_mode"]

log = logging.getLogger(__name__)

ENV_VAR = "AIAYN_COMPILE_WRAPPER"
WRAPPERS = ("python", "cpp")
OPTIONS: dict[str, dict[str, Any]] = {"python": {}, "cpp": {"cpp_wrapper": True}}  # torch.compile's options of each
TIMED_STEPS = 4  # steps timed with each wrapper; the fastest step of each decides. A generation shorter than these
# and the two compiling steps (10 in all) decides nothing, and the next decoder on the machine times again.


def wrapper_mode() -> str:
    """``$AIAYN_COMPILE_WRAPPER`` (default ``measure``); a ``ValueError`` naming it for another value."""
    return env_choice(ENV_VAR, ("measure", *WRAPPERS))


class ChosenStep:
    """The compiled step of ``model`` (``compile(model, options)`` -> step) through the wrapper chosen here, per batch
    size: from the override, the cache, or the first steps' timings. ``wrappers``: the candidates (only ``python``
    where Inductor writes AVX2 code: the C++ wrapper is untested there)."""

    def __init__(self, model: nn.Module, compile: Callable[[nn.Module, dict[str, Any]], Callable[..., Tensor]],
                 wrappers: tuple[str, ...] = WRAPPERS) -> None:
        self._model, self._compile, self._wrappers = model, compile, wrappers
        self._steps: dict[str, Callable[..., Tensor]] = {}
        self._chosen: dict[int, str] = {}  # batch rows -> wrapper
        self._times: dict[int, dict[str, list[float]]] = {}  # batch rows -> wrapper -> seconds of each step
        self._start: dict[int, tuple[float, float, float] | None] = {}  # when each batch size's timing began
        mode = wrapper_mode()
        self._fixed = mode if mode != "measure" else (wrappers[0] if len(wrappers) == 1 else None)

    def __call__(self, model: nn.Module, tokens: Tensor, *args: Any) -> Tensor:
        rows = tokens.shape[0]
        name = self._fixed or self._chosen.get(rows) or (None if rows in self._times else self._cached(rows))
        if name is not None:
            return self._step(name)(model, tokens, *args)
        times = self._times.setdefault(rows, {wrapper: [] for wrapper in self._wrappers})
        if all(times.values()):  # both compiled: the machine must be quiet from here (the compilers are other processes)
            self._start.setdefault(rows, kernel_choice.cpu_seconds())
        name = min(self._wrappers, key=lambda wrapper: len(times[wrapper]))  # in turn; each one's first call compiles
        start = time.perf_counter()
        try:
            logits = self._step(name)(model, tokens, *args)
        except Exception as err:  # the C++ wrapper failed to compile here (before the step ran): the Python one
            if name == "python" or times[name] or type(err).__name__ != "BackendCompilerFailed":
                raise
            log.warning("the compiled step's C++ wrapper does not build here, so it keeps Inductor's Python wrapper: %s",
                        str(err).splitlines()[0] if str(err) else type(err).__name__)
            self._fixed = "python"
            return self._step("python")(model, tokens, *args)
        times[name].append(time.perf_counter() - start)
        if all(len(seconds) > TIMED_STEPS for seconds in times.values()):
            self._decide(rows, times)
        return logits

    def _step(self, name: str) -> Callable[..., Tensor]:
        if name not in self._steps:
            self._steps[name] = self._compile(self._model, OPTIONS[name])
        return self._steps[name]

    def _shape(self, rows: int) -> str:
        """The cache's name for this model's step at ``rows`` rows: its dtype and weight formats, and the batch."""
        floats = sorted({str(p.dtype).removeprefix("torch.") for p in self._model.parameters() if p.is_floating_point()})
        formats = sorted({type(m).__name__ for m in self._model.modules() if type(m).__name__.endswith("Linear")})
        return f"decode step wrapper {'+'.join(floats)} {'+'.join(formats)} {rows} rows ({'/'.join(self._wrappers)})"

    def _cached(self, rows: int) -> str | None:
        """The cache's choice at ``rows`` rows, read once: a batch size being timed was not in it."""
        choice = kernel_choice.cached_choices(self._wrappers).get(self._shape(rows))
        if choice is not None:
            self._chosen[rows] = choice
        return choice

    def _decide(self, rows: int, times: dict[str, list[float]]) -> None:
        best = {wrapper: min(seconds[1:]) * 1e3 for wrapper, seconds in times.items()}  # the first call compiled
        choice = min(best, key=lambda wrapper: best[wrapper])
        self._chosen[rows] = choice
        shape = self._shape(rows)
        words = ", ".join(f"{wrapper} {ms:.3f}" for wrapper, ms in best.items()) + f" ms a step (fastest of {TIMED_STEPS}) -> {choice}"
        kernel_choice.remember_choices({shape: choice}, [f"{shape}: {words}"], self._start.pop(rows), "compiled step's wrapper",
                                       ENV_VAR)
        self._steps = {choice: self._steps[choice]}  # the other's graph is not called again
