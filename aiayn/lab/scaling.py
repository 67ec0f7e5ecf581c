"""Lab ``scaling``: why the scores are divided by sqrt(d_k) (paper section 3.2.1 and its footnote 4).

If the entries of q and k are independent with mean 0 and variance 1, ``q . k`` has variance
``d_k``. Unscaled, large ``d_k`` pushes the softmax to one-hot, where its gradient vanishes. We
draw such q and k, form the scores with and without the scaling, and measure: the variance of the
scores, the softmax's largest probability and its entropy (as a fraction of the uniform
distribution's ``log S``), and the norm of the gradient of a random linear loss with respect to
the scores (``dL/ds = p * (g - p . g)``, which goes to 0 when ``p`` is one-hot).
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import torch

from aiayn.lab.common import LabResult, verdict_of

CLAIM = (
    "dividing the scores by sqrt(d_k) keeps their variance near 1 and the softmax unsaturated; without it, "
    "at d_k = 512 the softmax saturates and the gradient with respect to the scores vanishes"
)


def measure(d_k: int, *, rows: int, keys: int, scaled: bool, generator: torch.Generator) -> dict[str, float]:
    """Score variance, mean max probability, mean normalised entropy and mean gradient norm for one ``d_k``."""
    q = torch.randn(rows, d_k, generator=generator)  # (R, d_k), unit variance entries
    k = torch.randn(keys, d_k, generator=generator)  # (S, d_k)
    scores = q @ k.T  # (R, S), variance d_k
    if scaled:
        scores = scores / math.sqrt(d_k)
    scores.requires_grad_(True)
    p = torch.softmax(scores, dim=-1)
    upstream = torch.randn(rows, keys, generator=generator)  # dL/dp of a random linear loss
    (p * upstream).sum().backward()
    entropy = -(p * p.clamp_min(1e-30).log()).sum(-1) / math.log(keys)  # 1 = uniform, 0 = one-hot
    grad_norms = scores.grad.norm(dim=-1)  # type: ignore[union-attr]  # (R,): one per query
    return {
        "score_var": float(scores.detach().var()),
        "max_prob": float(p.detach().max(-1).values.mean()),
        "entropy": float(entropy.detach().mean()),
        "grad_norm": float(grad_norms.mean()),
        "grad_norm_median": float(grad_norms.median()),
    }


def run(*, quick: bool = False, out_dir: Path = Path("lab"), seed: int = 0, data_dir: Path | None = None) -> LabResult:
    from aiayn.viz.style import SERIES_COLORS, new_figure, save_figure, style_axes, style_context

    start = time.perf_counter()
    d_ks = (16, 512) if quick else (4, 8, 16, 32, 64, 128, 256, 512, 1024)
    rows, keys = (64, 32) if quick else (2048, 64)
    generator = torch.Generator().manual_seed(seed)
    table = {
        label: {d: measure(d, rows=rows, keys=keys, scaled=scaled, generator=generator) for d in d_ks}
        for label, scaled in (("scaled", True), ("unscaled", False))
    }
    s512, u512 = table["scaled"][512], table["unscaled"][512]
    scaled_vars = [table["scaled"][d]["score_var"] for d in d_ks]
    ratio = u512["grad_norm"] / s512["grad_norm"]
    median_ratio = u512["grad_norm_median"] / s512["grad_norm_median"]
    checks = {
        "scaled variance within [0.8, 1.25] for every d_k": all(0.8 <= v <= 1.25 for v in scaled_vars),
        "unscaled softmax saturated at d_k=512 (mean max prob > 0.9)": u512["max_prob"] > 0.9,
        "scaled softmax not saturated at d_k=512 (mean max prob < 0.5)": s512["max_prob"] < 0.5,
        "unscaled gradient norm of the median query < 10% of scaled at d_k=512": median_ratio < 0.1,
    }
    verdict = verdict_of(checks.values())
    summary = (
        f"at d_k=512 over {keys} keys: score variance {s512['score_var']:.2f} scaled vs {u512['score_var']:.0f} unscaled; "
        f"max softmax probability {s512['max_prob']:.3f} vs {u512['max_prob']:.3f}; entropy {s512['entropy']:.2f} vs "
        f"{u512['entropy']:.3f} of log S; gradient norm w.r.t. the scores, mean over queries {s512['grad_norm']:.3g} vs "
        f"{u512['grad_norm']:.3g} (ratio {ratio:.3g}), median query {s512['grad_norm_median']:.3g} vs {u512['grad_norm_median']:.3g} "
        f"(ratio {median_ratio:.3g}). Scaled variance over d_k={d_ks[0]}..{d_ks[-1]}: {min(scaled_vars):.2f}..{max(scaled_vars):.2f}. "
        + "; ".join(f"{k}: {'yes' if v else 'NO'}" for k, v in checks.items())
    )
    with style_context():
        fig, axes = new_figure(1, 3, width=13, height=3.8)
        for i, label in enumerate(("scaled", "unscaled")):
            xs = list(d_ks)
            for j, (key, ylabel) in enumerate((("score_var", "score variance"), ("max_prob", "mean max softmax prob"), ("grad_norm", "|dL/d scores| (mean; dashed: median)"))):
                axes[0, j].plot(xs, [table[label][d][key] for d in d_ks], "o-", color=SERIES_COLORS[i], label=f"{label}" + (" (÷√d_k)" if label == "scaled" else ""))
                axes[0, j].set_xscale("log", base=2)
                style_axes(axes[0, j], xlabel="d_k", ylabel=ylabel, grid=True)
            axes[0, 2].plot(xs, [table[label][d]["grad_norm_median"] for d in d_ks], "s--", color=SERIES_COLORS[i], label=f"{label}, median query")
        axes[0, 0].set_yscale("log")
        axes[0, 2].set_yscale("log")
        axes[0, 0].set_title("variance of q·k")
        axes[0, 1].set_title("softmax saturation")
        axes[0, 2].set_title("gradient w.r.t. the scores")
        axes[0, 0].legend()
        axes[0, 2].legend()
    plot = save_figure(fig, out_dir / "lab_scaling.png")
    return LabResult(
        "scaling", CLAIM, verdict, summary,
        numbers={"d_k": list(d_ks), **{label: {str(d): v for d, v in t.items()} for label, t in table.items()}, "grad_ratio_512": ratio, "grad_median_ratio_512": median_ratio, "checks": checks},
        plot=plot, seconds=time.perf_counter() - start,
        settings={"rows": rows, "keys": keys, "q,k entries": "N(0, 1)", "seed": seed},
    )
