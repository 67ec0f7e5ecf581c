"""Lab ``prenorm``: Pre-LN trains a deep stack without warmup, Post-LN does not (Xiong et al., 2020).

Three runs of a deep encoder-decoder (12 + 12 layers by default, small width so it runs on a CPU)
on the copy task, everything equal but the norm position and the schedule:

* Post-LN (the paper's ``LayerNorm(x + Sublayer(x))``), constant learning rate, no warmup;
* Post-LN with a linear warmup to the same learning rate;
* Pre-LN (``x + Sublayer(LayerNorm(x))``), constant learning rate, no warmup.

Measured: the training loss, held-out token accuracy (teacher forcing) on new sequences, and at
initialisation the gradient norm of each decoder layer's FFN output weights (Xiong et al. show
Post-LN's is largest near the output, which is why it needs a small learning rate at first).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from aiayn.lab.common import LabResult, tail_mean, token_accuracy, train
from aiayn.models.config import EncoderDecoderConfig
from aiayn.models.encoder_decoder import EncoderDecoder
from aiayn.tasks.copy import copy_batch
from aiayn.training.losses import label_smoothed_cross_entropy
from aiayn.tokenization.special import PAD_ID

CLAIM = (
    "Pre-LN trains a deep stack (12+12 layers) without warmup; Post-LN does not, or only with warmup "
    "(Xiong et al., 2020)"
)
TRAINS = 0.9  # held-out token accuracy that counts as "trained"; chance is 1/13 with 13 symbols


def _config(norm: str, layers: int, d_model: int) -> EncoderDecoderConfig:
    return EncoderDecoderConfig(
        vocab_size=20, n_encoder_layers=layers, n_decoder_layers=layers, d_model=d_model, n_heads=4,
        d_ff=2 * d_model, dropout=0.0, norm_position=norm,
    )


def _init_grad_norms(model: EncoderDecoder, batch: tuple) -> list[float]:
    """Gradient norm of each decoder layer's FFN output weight on one batch, at initialisation."""
    src, tgt_in, tgt_out = batch
    model.train()
    loss_sum, count = label_smoothed_cross_entropy(model(src, tgt_in), tgt_out, pad_id=PAD_ID, smoothing=0.0)
    model.zero_grad()
    (loss_sum / count).backward()
    norms = [float(layer.ffn.w_2.weight.grad.norm()) for layer in model.decoder.layers]  # type: ignore[union-attr,operator]  # nn.Module attributes: mypy sees Tensor | Module
    model.zero_grad()
    return norms


def warmup_verdict(pre: float, post: float) -> str:
    """The verdict from the held-out accuracies without warmup: Pre-LN trains (:data:`TRAINS`) and Post-LN
    does not confirms; neither trains but Pre-LN is more than 10 points ahead is a partial confirmation."""
    if pre >= TRAINS > post:
        return "confirmed"
    if post < TRAINS and pre < TRAINS and pre > post + 0.1:
        return "partly confirmed"  # Pre-LN clearly ahead, but neither reached the bar
    return "not confirmed"  # both train, or Pre-LN fails too


def run(*, quick: bool = False, out_dir: Path = Path("lab"), seed: int = 0, data_dir: Path | None = None) -> LabResult:
    from aiayn.viz.style import SERIES_COLORS, new_figure, save_figure, style_axes, style_context

    start = time.perf_counter()
    layers, d_model, steps, batch_size, length, lr = (3, 16, 20, 8, 5, 1e-3) if quick else (12, 32, 500, 32, 8, 1e-3)
    warmup = max(1, steps // 4)
    runs = {
        "Post-LN, no warmup": ("post", lambda step: lr),
        "Post-LN, warmup": ("post", lambda step: lr * min(1.0, step / warmup)),
        "Pre-LN, no warmup": ("pre", lambda step: lr),
    }
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # small matrices: one thread is as fast, and kind to a shared machine
    results: dict[str, dict[str, Any]] = {}
    try:
        for name, (norm, schedule) in runs.items():
            torch.manual_seed(seed)
            model = EncoderDecoder(_config(norm, layers, d_model))
            test = copy_batch(512, length, 20, torch.Generator().manual_seed(seed + 1000))
            grads = _init_grad_norms(model, test)
            generator = torch.Generator().manual_seed(seed)
            log = train(model, lambda: copy_batch(batch_size, length, 20, generator), steps=steps, lr_at=schedule)
            acc = token_accuracy(model, test) if log.diverged_at is None else 0.0
            results[name] = {
                "norm": norm, "final_loss": tail_mean(log.losses), "accuracy": acc, "diverged_at": log.diverged_at,
                "losses": log.losses, "init_grad_norms": grads, "seconds": log.seconds,
            }
    finally:
        torch.set_num_threads(threads)

    post, post_w, pre = (results[k] for k in runs)
    pre_trains, post_trains, post_w_trains = pre["accuracy"] >= TRAINS, post["accuracy"] >= TRAINS, post_w["accuracy"] >= TRAINS
    verdict = warmup_verdict(pre["accuracy"], post["accuracy"])
    summary = (
        f"held-out token accuracy after {steps} steps at lr {lr:g} (trained = at least {TRAINS:.0%}; chance about 8%): "
        + "; ".join(f"{k} {v['accuracy']:.1%} (final loss {v['final_loss']:.3f}"
                    + (f", diverged at step {v['diverged_at']}" if v["diverged_at"] else "") + ")" for k, v in results.items())
        + f". Pre-LN without warmup trains: {'yes' if pre_trains else 'NO'}; Post-LN without warmup trains: "
        + f"{'yes' if post_trains else 'no'}; with warmup: {'yes' if post_w_trains else 'no'}. At initialisation the gradient "
        + f"norm of the last decoder layer's FFN weight over the first's is {post['init_grad_norms'][-1] / post['init_grad_norms'][0]:.2f} "
        + f"for Post-LN and {pre['init_grad_norms'][-1] / pre['init_grad_norms'][0]:.2f} for Pre-LN."
    )
    with style_context():
        fig, axes = new_figure(1, 2, width=12, height=4)
        for i, (name, r) in enumerate(results.items()):
            axes[0, 0].plot(range(1, len(r["losses"]) + 1), r["losses"], color=SERIES_COLORS[i], lw=1, label=f"{name} (acc {r['accuracy']:.0%})")
        for i, (name, r) in enumerate((("Post-LN", post), ("Pre-LN", pre))):  # the two Post-LN runs share their init
            axes[0, 1].plot(range(len(r["init_grad_norms"])), r["init_grad_norms"], "o-", color=SERIES_COLORS[2 * i], label=name)
        axes[0, 0].set_yscale("log")
        style_axes(axes[0, 0], title=f"copy task, {layers}+{layers} layers, d_model={d_model}", xlabel="step", ylabel="training loss", grid=True)
        style_axes(axes[0, 1], title="at initialisation", xlabel="decoder layer", ylabel="|grad| of FFN output weight", grid=True)
        axes[0, 1].set_yscale("log")
        axes[0, 0].legend()
        axes[0, 1].legend()
    plot = save_figure(fig, out_dir / "lab_prenorm.png")
    numbers = {k: {kk: vv for kk, vv in v.items() if kk != "losses"} for k, v in results.items()}
    return LabResult(
        "prenorm", CLAIM, verdict, summary, numbers=numbers, plot=plot, seconds=time.perf_counter() - start,
        settings={"layers": f"{layers}+{layers}", "d_model": d_model, "heads": 4, "steps": steps, "batch": batch_size,
                  "length": length, "lr": lr, "warmup": warmup, "optimizer": "Adam(0.9, 0.98)", "threads": 1, "seed": seed},
    )
