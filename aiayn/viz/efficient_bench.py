"""Softmax against its efficient variants (seeds 001 and 003): training cost and generation cost as length grows.

Training: forward + backward of causal self-attention on ``(B, H, n, Dh)`` queries, keys and values
for ``math`` (the formula, which holds the ``(B, H, n, n)`` matrix), ``sdpa`` (PyTorch's fused
kernel, ``O(n)`` memory but ``O(n^2)`` time), ``local`` (blocked sliding window, ``O(n w)``) and
``linear`` (chunked, ``O(n D^2)``); time and profiled peak memory, log-log slopes, and the crossover
length from which each variant beats ``sdpa``. Variants run interleaved at each length, so a burst
of load on a shared machine hits them alike.

Generation: the time of one new token through a multi-head attention layer at context ``c``:
softmax reading a (preallocated) KV cache of ``c`` keys, local its ring buffer of ``window`` keys,
linear its ``D x D`` state per head.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from aiayn.nn.attention import scaled_dot_product_attention
from aiayn.nn.flex_local import flex_available, flex_local_attention
from aiayn.nn.linear_attention import causal_linear_attention
from aiayn.nn.local_attention import local_attention
from aiayn.nn.multihead import MultiHeadAttention
from aiayn.viz.complexity import _available_bytes, _profiled_peak, fit_slope

__all__ = ["TRAIN_VARIANTS", "EfficientBench", "bench_efficient", "format_efficient", "plot_efficient", "sdpa_kernel_name"]

TRAIN_VARIANTS = ("math", "sdpa", "local", "linear")
GEN_VARIANTS = ("softmax", "local", "linear")


@dataclass
class EfficientBench:
    heads: int
    head_dim: int
    window: int
    batch: int
    repeats: int
    threads: int
    train: list[dict[str, Any]]  # {variant, n, seconds, peak_bytes, formula_bytes, skipped}
    generation: list[dict[str, Any]]  # {variant, context, seconds_per_token}
    time_slopes: dict[str, float | None]
    memory_slopes: dict[str, float | None]
    crossover: dict[str, int | None]  # the shortest length from which the variant is faster than sdpa
    sdpa_kernel: str
    fit_from: int
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def sdpa_kernel_name(q: Tensor) -> str:
    """Which ATen kernel ``F.scaled_dot_product_attention`` dispatches to for causal ``q`` (read from the profiler)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof, torch.inference_mode():
        scaled_dot_product_attention(q, q, q, causal=True, backend="sdpa")
    names = [e.name for e in prof.events() if "scaled_dot_product" in e.name and e.name != "aten::scaled_dot_product_attention"]
    return names[0] if names else "aten::scaled_dot_product_attention (math fallback)"


def _train_step(variant: str, q: Tensor, k: Tensor, v: Tensor, grad: Tensor, window: int) -> Callable[[], None]:
    def attend() -> Tensor:
        if variant in ("math", "sdpa"):
            return scaled_dot_product_attention(q, k, v, causal=True, backend=variant)[0]
        if variant == "local":
            return local_attention(q, k, v, window=window, causal=True)
        if variant == "flex":
            return flex_local_attention(q, k, v, window=window, causal=True)
        return causal_linear_attention(q, k, v)[0]

    def step() -> None:
        q.grad = k.grad = v.grad = None
        attend().backward(grad)

    return step


def _formula_bytes(variant: str, n: int, heads: int, head_dim: int, window: int, batch: int) -> int:
    """The size of the largest intermediate by the formula (float32)."""
    if variant == "math":
        return 4 * batch * heads * n * n  # the (B, H, n, n) scores; the weights and their gradients are as large again
    if variant == "local":
        return 4 * batch * heads * n * 2 * max(window - 1, 16)  # scores of each block against its and the previous block
    if variant == "linear":
        return 4 * batch * heads * math.ceil(n / 64) * head_dim * head_dim  # one (D, D) state per chunk
    return 4 * batch * heads * n * head_dim  # sdpa: the output


def bench_efficient(
    lengths: list[int],
    *,
    heads: int = 8,
    head_dim: int = 64,
    window: int = 256,
    batch: int = 1,
    repeats: int = 2,
    contexts: list[int] | None = None,
    gen_tokens: int = 16,
    threads: int | None = 1,
    measure_memory: bool = True,
    memory_budget: int | None = None,
    seed: int = 0,
    log: Callable[[str], None] = lambda line: None,
) -> EfficientBench:
    """Measure the training and generation costs described in the module docstring.

    A point whose formula memory, times 4 (scores, weights and their gradients), exceeds
    ``memory_budget`` (default: a third of the available memory) is skipped and says so. Raises
    ``ValueError`` for bad sizes.
    """
    if not lengths or min(lengths) < 1:
        raise ValueError(f"lengths must be positive and non-empty, got {lengths}")
    for name, value in (("heads", heads), ("head_dim", head_dim), ("window", window), ("batch", batch), ("repeats", repeats), ("gen_tokens", gen_tokens)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    lengths = sorted(set(lengths))
    contexts = sorted(set(contexts if contexts is not None else lengths))
    if memory_budget is None:
        available = _available_bytes()
        memory_budget = available // 3 if available else 8 * 2**30
    variants = TRAIN_VARIANTS + (("flex",) if torch.cuda.is_available() and flex_available("cuda") else ())
    generator = torch.Generator().manual_seed(seed)
    previous_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    used_threads = torch.get_num_threads()
    train: list[dict[str, Any]] = []
    try:
        kernel = sdpa_kernel_name(torch.randn(1, heads, 64, head_dim, generator=generator))
        for n in lengths:
            q, k, v, grad = (torch.randn(batch, heads, n, head_dim, generator=generator) for _ in range(4))
            for t in (q, k, v):
                t.requires_grad_(True)
            steps, rows = {}, {}
            for variant in variants:
                formula = _formula_bytes(variant, n, heads, head_dim, window, batch)
                rows[variant] = {"variant": variant, "n": n, "seconds": None, "peak_bytes": None, "formula_bytes": formula, "skipped": ""}
                if variant == "math" and 4 * formula > memory_budget:
                    rows[variant]["skipped"] = f"needs about {4 * formula / 2**30:.1f} GiB"
                    continue
                steps[variant] = _train_step(variant, q, k, v, grad, window)
                if n <= 2048:
                    steps[variant]()  # warm-up for the short ones; long ones are slow enough already
            best = dict.fromkeys(steps, math.inf)
            for round_ in range(repeats):  # interleaved rounds; the first one also profiles memory
                for name, step in steps.items():
                    start = time.perf_counter()
                    if measure_memory and round_ == 0:
                        rows[name]["peak_bytes"] = _profiled_peak(step)  # type: ignore[arg-type]
                    else:
                        step()
                    best[name] = min(best[name], time.perf_counter() - start)
            for name in steps:
                rows[name]["seconds"] = best[name]
            for variant in variants:
                row = rows[variant]
                train.append(row)
                seconds = "skipped" if row["seconds"] is None else f"{1000 * row['seconds']:.1f} ms"  # type: ignore[operator]
                peak = "-" if row["peak_bytes"] is None else f"{row['peak_bytes'] / 2**20:.1f} MiB"  # type: ignore[operator]
                log(f"  train n={n:>6} {variant:<7} {seconds:>12} {peak:>12} {row['skipped']}")
            del q, k, v, grad, steps
        generation = _bench_generation(contexts, heads, head_dim, window, gen_tokens, generator, log)
    finally:
        torch.set_num_threads(previous_threads)
    fit_from = lengths[len(lengths) // 2] if len(lengths) > 2 else lengths[0]
    time_slopes, memory_slopes, crossover = {}, {}, {}
    for variant in variants:
        fit = [r for r in train if r["variant"] == variant and r["n"] >= fit_from and r["seconds"] is not None]
        time_slopes[variant] = fit_slope([r["n"] for r in fit], [r["seconds"] for r in fit])
        memory_slopes[variant] = fit_slope([r["n"] for r in fit], [r["peak_bytes"] for r in fit]) if measure_memory else None
        crossover[variant] = _crossover(train, variant)
    return EfficientBench(
        heads, head_dim, window, batch, repeats, used_threads, train, generation, time_slopes, memory_slopes,
        crossover, kernel, fit_from,
        notes=[
            (f"training: causal self-attention kernels only (no projections), forward + backward, best of {repeats} interleaved rounds "
             f"(the first under the memory profiler); {used_threads} CPU thread(s)"),
            "peak memory: torch.profiler memory events during one forward + backward (allocations minus frees, peak of the running sum)",
            "math beyond the memory budget: not run; its formula size (the (B, H, n, n) scores) is given instead",
            f"generation: one MultiHeadAttention layer (d_model {heads * head_dim}), median time per token over {gen_tokens} tokens after a prefill of the context",
            f"sdpa dispatched to {kernel}",
            "FlexAttention (block-sparse local on GPU): " + ("measured as 'flex'" if "flex" in variants else "not measured (no CUDA device here)"),
        ],
    )


def _crossover(train: list[dict[str, Any]], variant: str) -> int | None:
    """The shortest length from which ``variant`` is faster than sdpa at every measured length."""
    if variant == "sdpa":
        return None
    times = {(r["variant"], r["n"]): r["seconds"] for r in train}
    lengths = sorted({r["n"] for r in train})
    faster = [times.get((variant, n)) is not None and times[(variant, n)] < times[("sdpa", n)] for n in lengths]
    for i, n in enumerate(lengths):
        if all(faster[i:]):
            return n
    return None


@torch.inference_mode()
def _bench_generation(
    contexts: list[int], heads: int, head_dim: int, window: int, tokens: int, generator: torch.Generator,
    log: Callable[[str], None],
) -> list[dict[str, Any]]:
    d_model = heads * head_dim
    torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=generator)))
    layers = {
        "softmax": MultiHeadAttention(d_model, heads),
        "local": MultiHeadAttention(d_model, heads, attention="local", window=window),
        "linear": MultiHeadAttention(d_model, heads, attention="linear"),
    }
    rows = []
    for context in contexts:
        prompt = torch.randn(1, context, d_model, generator=generator)
        new = torch.randn(1, tokens, d_model, generator=generator)
        caches = {}
        for name, layer in layers.items():
            caches[name] = layer.new_cache(max_len=context + tokens + 1)  # softmax: a static KV cache, no reallocation
            layer(prompt, causal=True, cache=caches[name])
        times: dict[str, list[float]] = {name: [] for name in layers}
        for i in range(tokens):  # interleaved: each token through every variant in turn
            for name, layer in layers.items():
                start = time.perf_counter()
                layer(new[:, i : i + 1], causal=True, cache=caches[name])
                times[name].append(time.perf_counter() - start)
        for name in layers:
            rows.append({"variant": name, "context": context, "seconds_per_token": statistics.median(times[name])})
            log(f"  generate context={context:>6} {name:<7} {1e3 * rows[-1]['seconds_per_token']:.3f} ms/token")  # type: ignore[operator]
        del caches
    return rows


def format_efficient(result: EfficientBench) -> str:
    """The measurements as plain tables, then slopes, crossovers and the generation costs."""
    lines = [f"causal self-attention, {result.heads} heads x head dim {result.head_dim}, window {result.window}, batch {result.batch}", ""]
    header = f"{'variant':<8}{'n':>8}{'fwd+bwd (ms)':>15}{'peak memory':>15}{'formula':>14}"
    lines += [header, "-" * len(header)]
    for r in result.train:
        seconds = "skipped" if r["seconds"] is None else f"{1000 * r['seconds']:.1f}"
        peak = "-" if r["peak_bytes"] is None else f"{r['peak_bytes'] / 2**20:.1f} MiB"
        lines.append(f"{r['variant']:<8}{r['n']:>8}{seconds:>15}{peak:>15}{r['formula_bytes'] / 2**20:>10.1f} MiB" + (f"  ({r['skipped']})" if r["skipped"] else ""))
    lines += ["", f"log-log slopes (n >= {result.fit_from}) and crossover with sdpa:"]
    for variant, slope in result.time_slopes.items():
        mem = result.memory_slopes.get(variant)
        cross = result.crossover.get(variant)
        lines.append(f"  {variant:<8} time {_num(slope):>6}   memory {_num(mem):>6}   faster than sdpa from n = {cross if cross else '-'}")
    lines += ["", f"{'generation':<10}{'context':>9}{'ms/token':>11}{'softmax/this':>14}"]
    softmax = {r["context"]: r["seconds_per_token"] for r in result.generation if r["variant"] == "softmax"}
    for r in result.generation:
        lines.append(f"{r['variant']:<10}{r['context']:>9}{1e3 * r['seconds_per_token']:>11.3f}{softmax[r['context']] / r['seconds_per_token']:>14.2f}")
    lines += ["", "notes:"] + [f"  - {n}" for n in result.notes]
    return "\n".join(lines)


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def plot_efficient(result: EfficientBench, path: str | Path) -> Path:
    """Three log-log panels: training time, training peak memory, time per generated token."""
    from aiayn.viz.style import (
        SERIES_COLORS,
        loglog_slope_label,
        new_figure,
        save_figure,
        style_axes,
        style_context,
    )

    with style_context():
        fig, axes = new_figure(1, 3, width=15, height=4.4)
        for i, variant in enumerate(result.time_slopes):
            rows = [r for r in result.train if r["variant"] == variant and r["seconds"] is not None]
            color = SERIES_COLORS[i % len(SERIES_COLORS)]
            axes[0, 0].plot([r["n"] for r in rows], [r["seconds"] for r in rows], "o-", color=color,
                            label=loglog_slope_label(variant, result.time_slopes[variant]))
            mem = [r for r in rows if r["peak_bytes"]]
            if mem:
                axes[0, 1].plot([r["n"] for r in mem], [r["peak_bytes"] / 2**20 for r in mem], "o-", color=color,
                                label=loglog_slope_label(variant, result.memory_slopes.get(variant)))
            if variant == "math":
                formula = [r for r in result.train if r["variant"] == "math"]
                axes[0, 1].plot([r["n"] for r in formula], [r["formula_bytes"] / 2**20 for r in formula], ":", color=color, label="math: one n x n matrix (formula)")
        for i, variant in enumerate(GEN_VARIANTS):
            rows = [r for r in result.generation if r["variant"] == variant]
            axes[0, 2].plot([r["context"] for r in rows], [1e3 * r["seconds_per_token"] for r in rows], "o-",
                            color=SERIES_COLORS[i + 1], label=variant)
        for ax in axes[0]:
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.legend()
        style_axes(axes[0, 0], title=f"forward + backward ({result.heads} heads x {result.head_dim})", xlabel="sequence length n", ylabel="seconds", grid=True)
        style_axes(axes[0, 1], title="peak memory (torch.profiler)", xlabel="sequence length n", ylabel="MiB", grid=True)
        style_axes(axes[0, 2], title="time per generated token", xlabel="context length", ylabel="ms", grid=True)
    return save_figure(fig, path)
