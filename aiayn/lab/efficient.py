"""Lab ``efficient``: what the ways out of attention's O(n^2) cost pay in quality (seeds 001 and 003).

Two measurements at one training budget per task (same steps, batch, learning rate and model size):

1. **Tiny Shakespeare, character level**, context 64: softmax, local attention with windows 16 and
   32, linear attention and the selective SSM; validation loss (nats per character) of each.
2. **Associative recall** (multi-query, as in Zoology's MQAR): a sequence of key-value pairs, then
   every key again in a new order, each followed by its value; the model must predict the value
   after each repeated key. Softmax can look a key up however many pairs there are; linear
   attention squeezes every pair into one fixed ``D x D`` state per head, which runs out as pairs
   are added; the selective SSM chooses what to write into its state, and should sit between them.
   Accuracy on new sequences, for a growing number of pairs.

The models are small decoder-only Transformers (Pre-LN, rotary positions, 4 heads). Rotary
positions and a learning rate of 1e-3 let softmax attention learn recall (an induction head)
within the budget: with learned positions, or at 3e-3, it stalled near 30% at 8 pairs.

Claims checked: (a) local and linear attention cost little validation loss on character-level text
against softmax (within 0.15 nats per character); (b) at the largest number of pairs softmax recalls
best, linear worst, the SSM between.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from aiayn.lab.common import LabResult
from aiayn.models.config import DecoderOnlyConfig
from aiayn.models.decoder_only import DecoderOnly

CLAIM = (
    "local and linear attention cost little quality on character-level text; on associative recall a "
    "fixed-size state runs out as pairs grow: softmax keeps recalling, linear attention fails first, the selective SSM sits between"
)
VARIANTS: dict[str, dict[str, Any]] = {
    "softmax": {},
    "local-16": {"attention": "local", "window": 16},
    "local-32": {"attention": "local", "window": 32},
    "linear": {"attention": "linear"},
    "ssm": {"mixer": "ssm", "ssm_state": 8},
}
RECALL_VARIANTS = ("softmax", "linear", "ssm")
LOSS_MARGIN = 0.15  # nats per character: "little" quality lost


def _model(variant: str, vocab: int, d_model: int, n_layers: int, context: int) -> DecoderOnly:
    config = DecoderOnlyConfig(
        vocab_size=vocab, n_layers=n_layers, d_model=d_model, n_heads=4, d_ff=4 * d_model, dropout=0.0,
        norm_position="pre", positions="rotary", max_len=context, pad_id=None, **VARIANTS[variant],
    )
    return DecoderOnly(config)


def _train(model: DecoderOnly, batches: Callable[[], tuple[Tensor, Tensor]], steps: int, lr: float) -> list[float]:
    """AdamW with linear warmup then cosine decay; cross-entropy on the targets that are not -100."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.99), weight_decay=0.01)
    warmup = max(1, steps // 10)
    model.train()
    losses = []
    for step in range(1, steps + 1):
        scale = step / warmup if step <= warmup else 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))
        for group in optimizer.param_groups:
            group["lr"] = lr * scale
        x, y = batches()
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten(), ignore_index=-100)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
    return losses


def _shakespeare(quick: bool, data_dir: Path | None) -> tuple[str, str, str]:
    """Train and validation text, and where they came from (a repeated toy text when the data is absent in quick mode)."""
    from aiayn.data.datasets import load_tinyshakespeare

    try:
        train = load_tinyshakespeare("train", data_dir=data_dir, download=False)
        return train, load_tinyshakespeare("val", data_dir=data_dir, download=False), "tinyshakespeare"
    except (FileNotFoundError, ValueError, OSError):
        if not quick:
            raise
        toy = "to be or not to be that is the question whether tis nobler in the mind to suffer\n" * 40
        return toy, toy[:800], "toy text (tinyshakespeare not found; quick mode only)"


def _text_quality(quick: bool, seed: int, data_dir: Path | None) -> dict[str, Any]:
    from aiayn.tokenization.char import CharTokenizer

    train_text, val_text, source = _shakespeare(quick, data_dir)
    context, d_model, n_layers, steps, batch = (32, 16, 1, 4, 4) if quick else (64, 64, 2, 600, 16)
    tokenizer = CharTokenizer.train([train_text + val_text])
    train_ids = torch.tensor(tokenizer.encode(train_text))
    val_ids = torch.tensor(tokenizer.encode(val_text))
    vocab = tokenizer.vocab_size

    def windows(ids: Tensor, starts: Tensor) -> tuple[Tensor, Tensor]:
        offsets = starts[:, None] + torch.arange(context + 1)[None, :]  # (B, context + 1)
        chunk = ids[offsets]
        return chunk[:, :-1], chunk[:, 1:]

    val_starts = torch.linspace(0, len(val_ids) - context - 2, 64 if not quick else 4).long()
    results: dict[str, Any] = {}
    for variant in VARIANTS:
        torch.manual_seed(seed)  # the same initial weights where the shapes agree, and the same batches
        model = _model(variant, vocab, d_model, n_layers, context)
        generator = torch.Generator().manual_seed(seed)

        def batches(generator: torch.Generator = generator) -> tuple[Tensor, Tensor]:
            return windows(train_ids, torch.randint(0, len(train_ids) - context - 1, (batch,), generator=generator))

        start = time.perf_counter()
        losses = _train(model, batches, steps, lr=3e-3)
        seconds = time.perf_counter() - start
        model.eval()
        with torch.no_grad():
            x, y = windows(val_ids, val_starts)
            val_loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten()).item()
        results[variant] = {"val_loss": val_loss, "train_loss_end": sum(losses[-20:]) / len(losses[-20:]),
                            "seconds": seconds, "parameters": sum(p.numel() for p in model.parameters()), "curve": losses}
    return {"source": source, "context": context, "d_model": d_model, "n_layers": n_layers, "steps": steps,
            "batch": batch, "vocab": vocab, "variants": results}


def recall_batch(batch: int, pairs: int, n_keys: int, n_values: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """``k1 v1 ... kP vP  q1 a1 ... qP aP``: distinct keys and random values, then every key again in a
    new order, each followed by its value. The targets are the values after the repeated keys.

    Token ids: keys ``0 .. n_keys - 1``, values ``n_keys .. n_keys + n_values - 1``. Returns ``(x (B, 4P), y)``
    with ``y = -100`` (ignored) everywhere except at each repeated key, where it is the value to predict.
    """
    keys = torch.rand(batch, n_keys, generator=generator).argsort(dim=1)[:, :pairs]  # (B, P), distinct per row
    values = torch.randint(n_keys, n_keys + n_values, (batch, pairs), generator=generator)
    order = torch.rand(batch, pairs, generator=generator).argsort(dim=1)  # the order in which keys are asked
    asked, answers = keys.gather(1, order), values.gather(1, order)
    shown = torch.stack([keys, values], dim=2).flatten(1)  # (B, 2P): k1 v1 k2 v2 ...
    x = torch.cat([shown, torch.stack([asked, answers], dim=2).flatten(1)], dim=1)  # (B, 4P)
    y = torch.full_like(x, -100)
    y[:, 2 * pairs :: 2] = answers  # at each asked key: its value comes next
    return x, y


def _recall(quick: bool, seed: int) -> dict[str, Any]:
    pair_counts = (2, 4) if quick else (4, 8, 16)
    n_keys, n_values = (8, 8) if quick else (32, 32)
    d_model, n_layers, steps, batch = (16, 2, 4, 8) if quick else (64, 2, 1600, 64)
    results: dict[str, dict[str, float]] = {variant: {} for variant in RECALL_VARIANTS}
    for pairs in pair_counts:
        for variant in RECALL_VARIANTS:
            torch.manual_seed(seed)
            model = _model(variant, n_keys + n_values, d_model, n_layers, 4 * pairs)
            generator = torch.Generator().manual_seed(seed)
            _train(model, lambda p=pairs, g=generator: recall_batch(batch, p, n_keys, n_values, g), steps, lr=1e-3)  # type: ignore[misc]
            model.eval()
            with torch.no_grad():
                x, y = recall_batch(500 if not quick else 16, pairs, n_keys, n_values, torch.Generator().manual_seed(seed + 1))
                asked = y != -100
                accuracy = (model(x).argmax(dim=-1)[asked] == y[asked]).float().mean().item()
            results[variant][str(pairs)] = accuracy
    return {"pairs": list(pair_counts), "n_keys": n_keys, "n_values": n_values, "d_model": d_model, "n_layers": n_layers,
            "steps": steps, "batch": batch, "accuracy": results, "chance": 1 / n_values}


def run(*, quick: bool = False, out_dir: Path = Path("lab"), seed: int = 0, data_dir: Path | None = None) -> LabResult:
    from aiayn.viz.style import (
        SERIES_COLORS,
        new_figure,
        save_figure,
        style_axes,
        style_context,
    )

    start = time.perf_counter()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # steadier timings on a shared machine, and the same for every variant
    try:
        text = _text_quality(quick, seed, data_dir)
        recall = _recall(quick, seed)
    finally:
        torch.set_num_threads(threads)

    losses = {v: r["val_loss"] for v, r in text["variants"].items()}
    cheap_local = all(losses[v] - losses["softmax"] <= LOSS_MARGIN for v in ("local-16", "local-32"))
    cheap_linear = losses["linear"] - losses["softmax"] <= LOSS_MARGIN
    cheap = cheap_local and cheap_linear
    last = str(recall["pairs"][-1])
    acc = {v: recall["accuracy"][v][last] for v in RECALL_VARIANTS}
    ordered = acc["softmax"] > acc["ssm"] > acc["linear"]
    linear_drops = recall["accuracy"]["linear"][str(recall["pairs"][0])] > acc["linear"]
    verdict = "confirmed" if cheap and ordered else ("partly confirmed" if cheap_local or cheap_linear or ordered or linear_drops else "not confirmed")
    summary = (
        f"validation loss (nats/char, {text['source']}, context {text['context']}, {text['steps']} steps): "
        + ", ".join(f"{v} {l:.3f}" for v, l in losses.items())
        + f"; within {LOSS_MARGIN} of softmax: local {'yes' if cheap_local else 'NO'}, "
        + f"linear {'yes' if cheap_linear else 'NO'} ({losses['linear'] - losses['softmax']:+.3f}). "
        + f"Associative recall accuracy (chance {recall['chance']:.3f}) by number of pairs {recall['pairs']}: "
        + "; ".join(f"{v} " + ", ".join(f"{recall['accuracy'][v][str(p)]:.2f}" for p in recall["pairs"]) for v in RECALL_VARIANTS)
        + f". At {last} pairs softmax > ssm > linear: {'yes' if ordered else 'NO'}"
        + f"; linear loses accuracy as pairs grow: {'yes' if linear_drops else 'NO'}."
    )
    with style_context():
        fig, axes = new_figure(1, 3, width=15, height=4.2)
        for i, (variant, r) in enumerate(text["variants"].items()):
            curve = r["curve"]
            k = max(1, len(curve) // 30)
            smooth = [sum(curve[j : j + k]) / len(curve[j : j + k]) for j in range(0, len(curve), k)]
            axes[0, 0].plot([j + 1 for j in range(0, len(curve), k)], smooth, color=SERIES_COLORS[i], label=variant)
        axes[0, 0].legend()
        style_axes(axes[0, 0], title="Tiny Shakespeare: training loss", xlabel="step", ylabel="nats / char", grid=True)
        names = list(losses)
        axes[0, 1].bar(range(len(names)), [losses[n] for n in names], color=SERIES_COLORS[: len(names)])
        axes[0, 1].set_xticks(range(len(names)))
        axes[0, 1].set_xticklabels(names)
        axes[0, 1].set_ylim(min(losses.values()) - 0.2, max(losses.values()) + 0.1)
        style_axes(axes[0, 1], title="validation loss at the same budget", ylabel="nats / char")
        for i, variant in enumerate(RECALL_VARIANTS):
            axes[0, 2].plot(recall["pairs"], [recall["accuracy"][variant][str(p)] for p in recall["pairs"]], "o-",
                            color=SERIES_COLORS[list(VARIANTS).index(variant)], label=variant)
        axes[0, 2].axhline(recall["chance"], color="grey", linestyle=":", label="chance")
        axes[0, 2].set_ylim(0, 1.05)
        axes[0, 2].legend()
        style_axes(axes[0, 2], title="associative recall", xlabel="key-value pairs", ylabel="accuracy", grid=True)
    plot = save_figure(fig, out_dir / "lab_efficient.png")
    for r in text["variants"].values():
        r["curve"] = r["curve"][:: max(1, len(r["curve"]) // 100)]  # keep the JSON small
    return LabResult(
        "efficient", CLAIM, verdict, summary, numbers={"text": text, "recall": recall}, plot=plot,
        seconds=time.perf_counter() - start,
        settings={"seed": seed, "threads": 1, "text_steps": text["steps"], "recall_steps": recall["steps"],
                  "d_model": text["d_model"], "n_layers": text["n_layers"]},
    )
