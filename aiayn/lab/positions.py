"""Lab ``positions``: sinusoidal vs learned positions beyond the training length (section 3.5).

The paper chose sinusoids because they "may allow the model to extrapolate to sequence lengths
longer than the ones encountered during training"; the tutorials repeat it (sinusoids generalise
to longer sequences, learned embeddings may fit the training lengths better). Two identical tiny
encoder-decoders learn the copy task at length ``L``; we evaluate both at ``L`` and at ``2L``.

Learned positions cannot represent a position past their table: with ``max_len = L + 1`` (all
the decoder needs in training) the model raises an error at ``2L``; this lab shows that error.
To measure anything at all, the learned model is built with a table of ``2L + 1`` rows, of which
only the first ``L + 1`` are ever trained: the rest stay at their random initialisation (checked
below), which is what a model with a large ``max_len`` trained on short sequences has.
Accuracy is teacher-forced per token, split into positions ``< L`` (seen in training) and
``L .. 2L-1`` (never seen); EOS is left out.
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
from aiayn.training.optim import noam_lr

CLAIM = (
    "sinusoidal positions let a model work beyond the training length; learned positions cannot "
    "(and may fit the training length better)"
)
VOCAB = 20  # 13 symbols after the 7 special tokens: chance is about 8%


def _config(kind: str, d_model: int, max_len: int) -> EncoderDecoderConfig:
    return EncoderDecoderConfig(
        vocab_size=VOCAB, n_encoder_layers=2, n_decoder_layers=2, d_model=d_model, n_heads=4, d_ff=2 * d_model,
        dropout=0.0, positions=kind, max_len=max_len,
    )


def extrapolation_verdict(sinusoidal: float, learned: float) -> str:
    """The verdict from the token accuracies past the training length: sinusoids at least 90% and learned
    positions under 50% confirm; sinusoids more than 10 points ahead is a partial confirmation."""
    if sinusoidal >= 0.9 and learned < 0.5:
        return "confirmed"
    if sinusoidal > learned + 0.1:
        return "partly confirmed"  # sinusoids clearly better past L, but far from solving it
    return "not confirmed"


def run(*, quick: bool = False, out_dir: Path = Path("lab"), seed: int = 0, data_dir: Path | None = None) -> LabResult:
    from aiayn.viz.style import SERIES_COLORS, new_figure, save_figure, style_axes, style_context

    start = time.perf_counter()
    length, d_model, steps, batch_size = (4, 16, 30, 16) if quick else (8, 64, 1200, 64)
    warmup = max(1, steps // 5)

    def noam(step: int) -> float:  # the paper's schedule, as in the copy task
        return noam_lr(step, d_model, warmup, factor=0.5)

    # The honest failure first: a table sized for training cannot look up position 2L.
    learned_small = EncoderDecoder(_config("learned", d_model, length + 1))
    src2, tgt_in2, _ = copy_batch(2, 2 * length, VOCAB, torch.Generator().manual_seed(seed))
    try:
        learned_small(src2, tgt_in2)
        error = "no error"
    except ValueError as e:
        error = str(e)

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    results: dict[str, dict[str, Any]] = {}
    try:
        for kind in ("sinusoidal", "learned"):
            torch.manual_seed(seed)
            model = EncoderDecoder(_config(kind, d_model, 2 * length + 1))
            init_rows = model.tgt_positions.weight.detach()[length + 1 :].clone() if kind == "learned" else None  # type: ignore[operator]  # a Module attribute: mypy sees Tensor | Module
            generator = torch.Generator().manual_seed(seed)
            log = train(model, lambda: copy_batch(batch_size, length, VOCAB, generator), steps=steps, lr_at=noam)
            test_l = copy_batch(512, length, VOCAB, torch.Generator().manual_seed(seed + 1))
            test_2l = copy_batch(512, 2 * length, VOCAB, torch.Generator().manual_seed(seed + 2))
            per_position = [token_accuracy(model, test_2l, slice(p, p + 1)) for p in range(2 * length)]
            untouched = None
            if init_rows is not None:
                untouched = float((model.tgt_positions.weight.detach()[length + 1 :] - init_rows).abs().max())  # type: ignore[operator]  # as above
            results[kind] = {
                "final_loss": tail_mean(log.losses),
                "acc_at_L": token_accuracy(model, test_l, slice(0, length)),
                "acc_2L_seen": token_accuracy(model, test_2l, slice(0, length)),
                "acc_2L_unseen": token_accuracy(model, test_2l, slice(length, 2 * length)),
                "per_position_2L": per_position,
                "untrained_rows_max_change": untouched,
                "seconds": log.seconds,
            }
    finally:
        torch.set_num_threads(threads)

    sin, lea = results["sinusoidal"], results["learned"]
    verdict = extrapolation_verdict(sin["acc_2L_unseen"], lea["acc_2L_unseen"])
    summary = (
        f"trained at L={length} ({steps} steps); token accuracy at L: sinusoidal {sin['acc_at_L']:.1%}, learned {lea['acc_at_L']:.1%}. "
        f"At 2L={2 * length}, positions < L: sinusoidal {sin['acc_2L_seen']:.1%}, learned {lea['acc_2L_seen']:.1%}; "
        f"positions L..2L-1 (never trained): sinusoidal {sin['acc_2L_unseen']:.1%}, learned {lea['acc_2L_unseen']:.1%} "
        f"(chance about {1 / (VOCAB - 7):.0%}). Learned table rows past L+1 changed by at most {lea['untrained_rows_max_change']:.1e} "
        f"in training (they stay random). With max_len=L+1 the learned model refuses 2L: \"{error}\"."
    )
    with style_context():
        fig, axes = new_figure(1, 1, width=8, height=4)
        ax = axes[0, 0]
        for i, kind in enumerate(results):
            ax.plot(range(2 * length), results[kind]["per_position_2L"], "o-", color=SERIES_COLORS[i], label=kind)
        ax.axvspan(length - 0.5, 2 * length - 0.5, color="#ddd", alpha=0.5, label="positions never trained")
        ax.axhline(1 / (VOCAB - 7), color="#999", ls="--", lw=1, label="chance")
        style_axes(ax, title=f"copy task trained at L={length}, evaluated at 2L={2 * length}", xlabel="target position",
                   ylabel="token accuracy (teacher forcing)", grid=True)
        ax.set_ylim(0, 1.05)
        ax.legend()
    plot = save_figure(fig, out_dir / "lab_positions.png")
    return LabResult(
        "positions", CLAIM, verdict, summary, numbers={**results, "learned_max_len_L_plus_1_error": error}, plot=plot,
        seconds=time.perf_counter() - start,
        settings={"L": length, "layers": "2+2", "d_model": d_model, "steps": steps, "batch": batch_size,
                  "schedule": f"noam, warmup {warmup}", "threads": 1, "seed": seed},
    )
