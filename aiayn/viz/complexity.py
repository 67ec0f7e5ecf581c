"""Time and memory of one layer against sequence length: attention (``math``, ``sdpa``), LSTM, convolution.

The paper's Table 1 (and the tutorials' complexity table): self-attention costs ``O(n^2 d)`` per
layer with ``O(1)`` sequential steps, a recurrent layer ``O(n d^2)`` with ``O(n)`` sequential
steps, a convolution ``O(k n d^2)``. Here each layer runs forward (inference mode) on ``(B, n, d)``
inputs for growing ``n``; the slope of ``log time`` against ``log n`` is about 2 for attention and
about 1 for the others once ``n`` is large enough for the dominant term to show.

Memory on CPU: ``tracemalloc`` cannot see torch's allocations, so the peak is read from
``torch.profiler``'s memory events (every allocation and free of the CPU allocator during one
call, summed in time order; the maximum of that running sum). Beside it the analytic size of the
largest intermediate is given: the ``(B, H, n, n)`` score matrix for ``math`` attention, the
``(B, n, d)`` output for the others (the fused ``sdpa`` kernel works in blocks and never holds
the full matrix).
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
from torch import Tensor, nn

from aiayn.nn.attention import scaled_dot_product_attention

__all__ = ["LAYERS", "BenchPoint", "BenchResult", "bench_attention", "fit_slope", "default_lengths", "plot_bench"]

LAYERS = ("math", "sdpa", "lstm", "conv")
LAYER_NAMES = {"math": "attention (math)", "sdpa": "attention (sdpa)", "lstm": "LSTM", "conv": "convolution (k=3)"}
COMPLEXITY = {  # seed 001 / paper Table 1: per-layer complexity, sequential operations
    "math": ("O(n^2 d)", "O(1)"),
    "sdpa": ("O(n^2 d)", "O(1)"),
    "lstm": ("O(n d^2)", "O(n)"),
    "conv": ("O(k n d^2)", "O(1)"),
}


@dataclass
class BenchPoint:
    layer: str
    length: int
    seconds: float | None  # best of the repeats; None when skipped
    peak_bytes: int | None  # torch.profiler memory events; None when not measured
    analytic_bytes: int  # size of the largest intermediate
    skipped: str = ""


@dataclass
class BenchResult:
    d_model: int
    n_heads: int
    batch: int
    repeats: int
    points: list[BenchPoint]
    time_slopes: dict[str, float | None]
    memory_slopes: dict[str, float | None]
    fit_from: int  # slopes are fitted on lengths >= this
    threads: int
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def default_lengths(max_len: int, min_len: int = 256) -> list[int]:
    """Powers of two from ``min_len`` up to ``max_len`` (``max_len`` itself included)."""
    if max_len < min_len:
        raise ValueError(f"max_len must be >= min_len={min_len}, got {max_len}")
    lengths, n = [], min_len
    while n < max_len:
        lengths.append(n)
        n *= 2
    return lengths + [max_len]


def fit_slope(xs: list[float], ys: list[float]) -> float | None:
    """Least-squares slope of ``log y`` against ``log x``; ``None`` with fewer than two positive points."""
    pts = [(math.log(x), math.log(y)) for x, y in zip(xs, ys) if x > 0 and y is not None and y > 0]
    if len(pts) < 2:
        return None
    mx = sum(p[0] for p in pts) / len(pts)
    my = sum(p[1] for p in pts) / len(pts)
    var = sum((p[0] - mx) ** 2 for p in pts)
    return sum((p[0] - mx) * (p[1] - my) for p in pts) / var if var > 0 else None


def _analytic_bytes(layer: str, n: int, d: int, heads: int, batch: int) -> int:
    if layer == "math":
        return 4 * batch * heads * n * n  # the (B, H, n, n) scores (the weights are another of the same size)
    return 4 * batch * n * d  # the (B, n, d) output


def _make(layer: str, n: int, d: int, heads: int, batch: int, generator: torch.Generator) -> Callable[[], Tensor]:
    if layer in ("math", "sdpa"):
        q, k, v = (torch.randn(batch, heads, n, d // heads, generator=generator) for _ in range(3))  # (B, H, n, Dh)
        return lambda: scaled_dot_product_attention(q, k, v, backend=layer)[0]
    if layer == "lstm":
        lstm = nn.LSTM(d, d, batch_first=True)
        x = torch.randn(batch, n, d, generator=generator)
        return lambda: lstm(x)[0]
    if layer == "conv":
        conv = nn.Conv1d(d, d, kernel_size=3, padding=1)
        x = torch.randn(batch, d, n, generator=generator)  # (B, d, n): channels first
        return lambda: conv(x)
    raise ValueError(f"layer must be one of {LAYERS}, got {layer!r}")


def _best_time(fn: Callable[[], Tensor], repeats: int) -> float:
    fn()  # warm-up: first-call allocations and kernel selection
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


@contextmanager
def _native_stderr_silenced() -> Iterator[None]:
    """Send the C++ stderr (file descriptor 2) to /dev/null: kineto prints ``USDT: profiler_start`` and
    ``profiler_stop`` lines on every profile, with no setting to turn them off."""
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def _profiled_peak(fn: Callable[[], Tensor]) -> int | None:
    """Peak of the running sum of CPU allocations minus frees during one call (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile

    with _native_stderr_silenced(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = fn()
        del out
    try:
        events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
        events.sort(key=lambda e: e.start_ns())
        running = peak = 0
        for e in events:
            running += e.nbytes()
            peak = max(peak, running)
        return peak
    except AttributeError:  # a torch without kineto memory events
        return None


def _available_bytes() -> int | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def bench_attention(
    lengths: list[int],
    *,
    d_model: int = 64,
    n_heads: int = 1,
    batch: int = 1,
    repeats: int = 3,
    layers: tuple[str, ...] = LAYERS,
    measure_memory: bool = True,
    memory_budget: int | None = None,
    fit_from: int | None = None,
    threads: int | None = 1,
    seed: int = 0,
) -> BenchResult:
    """Time each layer at each length (best of ``repeats``) and, optionally, profile its peak memory.

    A point whose largest intermediate times 3 exceeds ``memory_budget`` (default: half the
    available memory) is skipped and says so. Slopes are fitted on lengths ``>= fit_from``
    (default: the upper half of ``lengths``). ``threads``: torch CPU threads while measuring (default 1:
    steadier on a shared machine; ``None`` keeps the current setting). Raises ``ValueError`` for bad
    sizes or layer names.
    """
    if not lengths or min(lengths) < 1:
        raise ValueError(f"lengths must be positive and non-empty, got {lengths}")
    if d_model < 1 or n_heads < 1 or d_model % n_heads:
        raise ValueError(f"d_model must be a positive multiple of n_heads, got d_model={d_model}, n_heads={n_heads}")
    if batch < 1 or repeats < 1:
        raise ValueError(f"batch and repeats must be >= 1, got batch={batch}, repeats={repeats}")
    for layer in layers:
        if layer not in LAYERS:
            raise ValueError(f"layer must be one of {LAYERS}, got {layer!r}")
    lengths = sorted(set(lengths))
    if memory_budget is None:
        available = _available_bytes()
        memory_budget = available // 2 if available else 8 * 2**30
    if fit_from is None:
        fit_from = lengths[len(lengths) // 2] if len(lengths) > 2 else lengths[0]
    generator = torch.Generator().manual_seed(seed)
    points = []
    previous_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    used_threads = torch.get_num_threads()
    try:
        with torch.inference_mode():
            for layer in layers:
                for n in lengths:
                    analytic = _analytic_bytes(layer, n, d_model, n_heads, batch)
                    if 3 * analytic > memory_budget:
                        points.append(BenchPoint(layer, n, None, None, analytic, f"needs about {3 * analytic / 2**30:.1f} GiB"))
                        continue
                    fn = _make(layer, n, d_model, n_heads, batch, generator)
                    seconds = _best_time(fn, repeats)
                    peak = _profiled_peak(fn) if measure_memory else None
                    points.append(BenchPoint(layer, n, seconds, peak, analytic))
                    del fn
    finally:
        torch.set_num_threads(previous_threads)
    time_slopes, memory_slopes = {}, {}
    for layer in layers:
        fit = [p for p in points if p.layer == layer and p.length >= fit_from and p.seconds is not None]
        time_slopes[layer] = fit_slope([p.length for p in fit], [p.seconds for p in fit])  # type: ignore[misc]
        memory_slopes[layer] = fit_slope([p.length for p in fit], [p.peak_bytes for p in fit]) if measure_memory else None  # type: ignore[misc]
    return BenchResult(
        d_model, n_heads, batch, repeats, points, time_slopes, memory_slopes, fit_from, used_threads,
        notes=[
            f"forward pass in inference mode, best of {repeats} runs after a warm-up; {used_threads} CPU thread(s)",
            "peak memory: torch.profiler memory events (CPU allocator allocations minus frees during one call, peak of the running sum)",
            "analytic: size of the largest intermediate, the (B, H, n, n) scores for math attention, the (B, n, d) output otherwise",
        ],
    )


def format_bench(result: BenchResult) -> str:
    """A table of the measurements, the fitted slopes and the complexity table they check."""
    lines = [f"d_model={result.d_model}, heads={result.n_heads}, batch={result.batch}", ""]
    header = f"{'layer':<20}{'n':>8}{'time (ms)':>12}{'peak memory':>14}{'largest interm.':>17}"
    lines += [header, "-" * len(header)]
    for p in result.points:
        time_text = f"{1000 * p.seconds:.3f}" if p.seconds is not None else "skipped"
        peak = _mib(p.peak_bytes) if p.peak_bytes is not None else "-"
        lines.append(f"{LAYER_NAMES[p.layer]:<20}{p.length:>8}{time_text:>12}{peak:>14}{_mib(p.analytic_bytes):>17}"
                     + (f"  ({p.skipped})" if p.skipped else ""))
    lines += ["", f"fitted log-log slopes (lengths >= {result.fit_from}):"]
    lines.append(f"{'layer':<20}{'complexity':>12}{'sequential':>12}{'time slope':>12}{'memory slope':>14}")
    for layer, slope in result.time_slopes.items():
        cost, seq = COMPLEXITY[layer]
        mem = result.memory_slopes.get(layer)
        lines.append(f"{LAYER_NAMES[layer]:<20}{cost:>12}{seq:>12}{_num(slope):>12}{_num(mem):>14}")
    lines += ["", "notes:"] + [f"  - {n}" for n in result.notes]
    return "\n".join(lines)


def _mib(value: int) -> str:
    return f"{value / 2**20:.3f} MiB"


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def plot_bench(result: BenchResult, path: str | Path) -> Path:
    """Log-log plot: time against n (left) and profiled peak memory against n (right), slopes in the legend."""
    from aiayn.viz.style import SERIES_COLORS, loglog_slope_label, new_figure, save_figure, style_axes, style_context

    with style_context():
        fig, axes = new_figure(1, 2, width=11, height=4.4)
        for i, layer in enumerate(result.time_slopes):
            pts = [p for p in result.points if p.layer == layer and p.seconds is not None]
            if not pts:
                continue
            color = SERIES_COLORS[i]
            axes[0, 0].plot([p.length for p in pts], [p.seconds for p in pts], "o-", color=color,
                            label=loglog_slope_label(LAYER_NAMES[layer], result.time_slopes[layer]))
            mem = [p for p in pts if p.peak_bytes]
            if mem:
                axes[0, 1].plot([p.length for p in mem], [(p.peak_bytes or 0) / 2**20 for p in mem], "o-", color=color,
                                label=loglog_slope_label(LAYER_NAMES[layer], result.memory_slopes.get(layer)))
        for ax in axes[0]:
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
        style_axes(axes[0, 0], title=f"forward time (d={result.d_model})", xlabel="sequence length n", ylabel="seconds", grid=True)
        style_axes(axes[0, 1], title="peak memory (torch.profiler)", xlabel="sequence length n", ylabel="MiB", grid=True)
        axes[0, 0].legend()
        if axes[0, 1].lines:
            axes[0, 1].legend()
    return save_figure(fig, path)
