"""Lab ``heads``: h heads of size d_model/h cost about as much as one head of full width (section 3.2.2).

"Due to the reduced dimension of each head, the total computational cost is similar to that of
single-head attention with full dimensionality." Projections are the same four ``d x d`` matrices
either way; the score and value products cost ``h * n^2 * (d/h) = n^2 d`` in both. We count the
FLOPs of the library's :class:`~aiayn.nn.multihead.MultiHeadAttention` with FlopCounterMode
(``math`` backend, whose matmuls the counter can see) and time it on both backends.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

from aiayn.lab.common import LabResult, verdict_of
from aiayn.nn.multihead import MultiHeadAttention

CLAIM = "multi-head attention (h heads of size d/h) costs about the same as one head of full width d: FLOPs and measured time"


def _best_times(modules: list[MultiHeadAttention], x: torch.Tensor, repeats: int) -> list[float]:
    """Best time of each module, runs interleaved so that a burst of load elsewhere hits all alike."""
    best = [math.inf] * len(modules)
    with torch.inference_mode():
        for module in modules:
            module(x)  # warm-up
        for _ in range(repeats):
            for i, module in enumerate(modules):
                start = time.perf_counter()
                module(x)
                best[i] = min(best[i], time.perf_counter() - start)
    return best


def run(*, quick: bool = False, out_dir: Path = Path("lab"), seed: int = 0, data_dir: Path | None = None) -> LabResult:
    from aiayn.viz.style import SERIES_COLORS, new_figure, save_figure, style_axes, style_context

    start = time.perf_counter()
    d_model, batch, repeats = (64, 2, 1) if quick else (512, 4, 7)
    lengths = (16, 32) if quick else (64, 256, 1024)
    heads = (1, 8)
    torch.manual_seed(seed)
    rows: list[dict[str, Any]] = []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # steadier timings on a shared machine, and the same for every variant
    try:
        for n in lengths:
            x = torch.randn(batch, n, d_model)  # (B, n, d)
            variants = [(h, backend) for h in heads for backend in ("math", "sdpa")]
            modules = [MultiHeadAttention(d_model, h, backend=backend).eval() for h, backend in variants]
            seconds = _best_times(modules, x, repeats)
            for (h, backend), module, t in zip(variants, modules, seconds):
                flops = None
                if backend == "math":
                    with FlopCounterMode(display=False) as counter, torch.no_grad():
                        module(x)
                    flops = counter.get_total_flops()
                rows.append({"n": n, "heads": h, "backend": backend, "flops": flops, "seconds": t})
    finally:
        torch.set_num_threads(threads)

    def get(n: int, h: int, backend: str, key: str) -> float:
        return next(float(r[key]) for r in rows if r["n"] == n and r["heads"] == h and r["backend"] == backend)

    flop_ratios = {n: get(n, 8, "math", "flops") / get(n, 1, "math", "flops") for n in lengths}
    time_ratios = {f"{b}@{n}": get(n, 8, b, "seconds") / get(n, 1, b, "seconds") for n in lengths for b in ("math", "sdpa")}
    flops_equal = all(abs(r - 1) < 1e-9 for r in flop_ratios.values())
    times_close = all(0.5 <= r <= 2.0 for r in time_ratios.values())
    verdict = verdict_of((flops_equal, times_close))
    n_max = lengths[-1]
    summary = (
        f"d_model={d_model}, batch {batch}: FLOPs of 8 heads / 1 head = "
        + ", ".join(f"{r:.4f} (n={n})" for n, r in flop_ratios.items())
        + f" ({get(n_max, 8, 'math', 'flops') / 1e9:.3f} GFLOP at n={n_max} either way); measured time 8 heads / 1 head = "
        + ", ".join(f"{r:.2f} ({k})" for k, r in time_ratios.items())
        + f". FLOPs equal: {'yes' if flops_equal else 'NO'}; every time ratio within 0.5..2: {'yes' if times_close else 'NO'}. "
        + "The matmul FLOPs are equal, but the scores are (B, h, n, n): with 8 heads the softmax and its memory traffic "
        + f"cover {8 * batch * n_max * n_max * 4 / 2**20:.0f} MiB of scores at n={n_max} against "
        + f"{batch * n_max * n_max * 4 / 2**20:.0f} MiB with one head, which FLOP counts of matmuls leave out."
    )
    with style_context():
        fig, axes = new_figure(1, 2, width=11, height=3.8)
        width = 0.2
        for i, (h, backend) in enumerate([(h, b) for h in heads for b in ("math", "sdpa")]):
            xs = [j + (i - 1.5) * width for j in range(len(lengths))]
            axes[0, 1].bar(xs, [1000 * get(n, h, backend, "seconds") for n in lengths], width, color=SERIES_COLORS[i], label=f"{h} head{'s' if h > 1 else ''}, {backend}")
        for i, h in enumerate(heads):
            xs = [j + (i - 0.5) * 0.35 for j in range(len(lengths))]
            axes[0, 0].bar(xs, [get(n, h, "math", "flops") / 1e9 for n in lengths], 0.35, color=SERIES_COLORS[2 * i], label=f"{h} head{'s' if h > 1 else ''}")
        for ax in axes[0]:
            ax.set_xticks(range(len(lengths)))
            ax.set_xticklabels([f"n={n}" for n in lengths])
            ax.legend()
        style_axes(axes[0, 0], title=f"FLOPs (FlopCounterMode), d_model={d_model}", ylabel="GFLOP")
        style_axes(axes[0, 1], title="forward time (best of runs)", ylabel="ms")
    plot = save_figure(fig, out_dir / "lab_heads.png")
    return LabResult(
        "heads", CLAIM, verdict, summary,
        numbers={"rows": rows, "flop_ratios": {str(k): v for k, v in flop_ratios.items()}, "time_ratios": time_ratios},
        plot=plot, seconds=time.perf_counter() - start,
        settings={"d_model": d_model, "batch": batch, "lengths": list(lengths), "repeats": repeats, "threads": 1, "seed": seed},
    )
