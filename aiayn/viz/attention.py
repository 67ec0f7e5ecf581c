"""Attention weights of a model on one text, and PNG grids of them (layer x head).

The weights come from the ``math`` backend through each family's ``attention_maps`` (the only
backend that returns them). One :class:`AttentionView` per kind of attention:

* ``encoder``: encoder self-attention (encoder-decoder and encoder-only models);
* ``decoder_self``: masked (causal) decoder self-attention (encoder-decoder and decoder-only);
* ``decoder_cross``: encoder-decoder attention, target queries over source keys.

Inputs follow the training conventions of :mod:`aiayn.data`: the source gets EOS, the decoder
input is BOS + target, an encoder-only model sees ``[CLS] text [SEP]``, a decoder-only model the
bare text.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from aiayn.decoding.text import beam_config, seq2seq_decoder, source_ids
from aiayn.models.decoder_only import DecoderOnly
from aiayn.models.encoder_decoder import EncoderDecoder
from aiayn.models.encoder_only import EncoderOnly
from aiayn.tokenization import N_SPECIAL
from aiayn.tokenization.base import Tokenizer
from aiayn.tokenization.special import sentence_ids, special_ids

__all__ = ["AttentionView", "collect_attention", "token_labels", "plot_attention_grid", "VIEW_TITLES"]

VIEW_TITLES = {
    "encoder": "encoder self-attention",
    "decoder_self": "decoder masked self-attention",
    "decoder_cross": "encoder-decoder (cross) attention",
}


@dataclass
class AttentionView:
    """One kind of attention: ``weights (L, H, T, S)`` for query tokens (T) over key tokens (S)."""

    name: str
    weights: np.ndarray
    queries: list[str]
    keys: list[str]

    @property
    def title(self) -> str:
        return VIEW_TITLES.get(self.name, self.name)


def token_labels(tokenizer: Tokenizer, ids: list[int]) -> list[str]:
    """Readable axis labels for ``ids``: spaces shown as ``␣``, unknown ids as ``#id``."""
    labels = []
    for i in ids:
        token = tokenizer.id_to_token(i)
        # Byte-level BPE stores "Ġman" and "Ã¼" for " man" and "ü": decoding the one id shows the text itself.
        text = tokenizer.decode([i]) if token is not None and i >= N_SPECIAL else ""
        if text and "\ufffd" not in text:
            token = text
        labels.append(f"#{i}" if token is None else token.replace(" ", "␣").replace("\n", "⏎") or "∅")
    return labels


@torch.no_grad()
def collect_attention(
    model: nn.Module,
    src_tokenizer: Tokenizer,
    text: str,
    *,
    target: str | None = None,
    tgt_tokenizer: Tokenizer | None = None,
    max_target_len: int = 64,
) -> tuple[list[AttentionView], str | None]:
    """Run ``model`` (eval mode) on ``text`` and return its attention views and the target used.

    For an encoder-decoder without ``target``, the model's own greedy output (at most
    ``max_target_len`` tokens) is the target. Raises ``ValueError`` for an empty text or a model
    that is not one of the three families.
    """
    if not text:
        raise ValueError("text must not be empty")
    tgt_tokenizer = tgt_tokenizer if tgt_tokenizer is not None else src_tokenizer
    model.eval()
    if isinstance(model, EncoderDecoder):
        src_ids = source_ids(src_tokenizer, text)
        src = torch.tensor([src_ids])
        specials = special_ids(tgt_tokenizer)  # ours, or a pretrained model's own ids
        bos, eos = specials.need("bos", "attention maps"), specials.need("eos", "attention maps")
        if target is None:
            from aiayn.decoding.greedy import greedy  # only needed here

            decoder = seq2seq_decoder(model, tgt_tokenizer)  # starts from the target tokenizer's BOS
            out = greedy(decoder, src, max_new_tokens=max_target_len, eos_id=eos, pad_id=beam_config(tgt_tokenizer).pad_id).tokens[0].tolist()
            y = out[: out.index(eos)] if eos in out else out
            target = tgt_tokenizer.decode(y)
        else:
            y = tgt_tokenizer.encode(target)
        tgt_ids = [bos, *y]
        maps = model.attention_maps(src, torch.tensor([tgt_ids]))
        src_labels, tgt_labels = token_labels(src_tokenizer, src_ids), token_labels(tgt_tokenizer, tgt_ids)
        views = [
            _view("encoder", maps["encoder"], src_labels, src_labels),
            _view("decoder_self", maps["decoder_self"], tgt_labels, tgt_labels),
            _view("decoder_cross", maps["decoder_cross"], tgt_labels, src_labels),
        ]
        return views, target
    if isinstance(model, DecoderOnly):
        ids = src_tokenizer.encode(text)
        labels = token_labels(src_tokenizer, ids)
        return [_view("decoder_self", model.attention_maps(torch.tensor([ids]))["decoder_self"], labels, labels)], None
    if isinstance(model, EncoderOnly):
        cls, sep, _ = sentence_ids(src_tokenizer)
        ids = [cls, *src_tokenizer.encode(text), sep]
        labels = token_labels(src_tokenizer, ids)
        return [_view("encoder", model.attention_maps(torch.tensor([ids]))["encoder"], labels, labels)], None
    raise ValueError(f"model must be an EncoderDecoder, DecoderOnly or EncoderOnly, got {type(model).__name__}")


def _view(name: str, layers: list[torch.Tensor], queries: list[str], keys: list[str]) -> AttentionView:
    weights = torch.stack([w[0] for w in layers]).float().numpy()  # (L, H, T, S), batch row 0
    return AttentionView(name, weights, queries, keys)


def plot_attention_grid(view: AttentionView, path: str | os.PathLike[str], *, title: str | None = None) -> Path:
    """One PNG: a heatmap per (layer, head), rows = layers, columns = heads, tokens on the axes.

    All panels share one colour scale, from 0 to the largest weight in the grid (shown on the colour bar).

    Token labels are written on the outer axes (queries on the left column, keys under the bottom
    row); with more than 60 tokens every n-th label is kept so they stay legible.
    """
    from aiayn.viz.style import HEATMAP_CMAP, new_figure, save_figure, style_context

    n_layers, n_heads, q_len, k_len = view.weights.shape
    vmax = max(float(view.weights.max()), 1e-6)  # one colour scale for the whole grid, up to its largest weight
    cell = 0.16  # inches per token
    panel_w, panel_h = max(1.6, k_len * cell + 0.6), max(1.4, q_len * cell + 0.4)
    scale = min(1.0, 40.0 / (panel_w * n_heads), 60.0 / (panel_h * n_layers))  # keep huge models drawable
    with style_context():
        # Margins in inches for the outer labels; constrained layout would be exact but slow on big grids.
        left = 0.45 + 0.07 * max(len(q) for q in view.queries)
        bottom = 0.45 + 0.07 * max(len(k) for k in view.keys)
        width = panel_w * n_heads * scale + left + 1.2
        height = panel_h * n_layers * scale + bottom + 0.9
        fig, axes = new_figure(n_layers, n_heads, width=width, height=height, layout=None)
        fig.subplots_adjust(left=left / width, right=1 - 1.2 / width, bottom=bottom / height, top=1 - 0.9 / height,
                            wspace=0.15, hspace=0.35)
        image = None
        for layer in range(n_layers):
            for head in range(n_heads):
                ax = axes[layer, head]
                image = ax.imshow(view.weights[layer, head], cmap=HEATMAP_CMAP, vmin=0.0, vmax=vmax, aspect="auto", interpolation="nearest")
                ax.set_title(f"layer {layer} · head {head}", fontsize=7)
                ax.tick_params(length=0, labelsize=6)
                # Labels on the outer panels only; inner panels get no ticks at all (much faster layout).
                if layer == n_layers - 1:
                    _label_axis(ax.xaxis, view.keys)
                    ax.tick_params(axis="x", labelrotation=90)
                    ax.set_xlabel("key", fontsize=7)
                else:
                    ax.set_xticks([])
                if head == 0:
                    _label_axis(ax.yaxis, view.queries)
                    ax.set_ylabel("query", fontsize=7)
                else:
                    ax.set_yticks([])
        fig.suptitle(title or view.title)
        if image is not None:
            bar = fig.add_axes((1 - 0.95 / width, 0.25, 0.15 / width, 0.5))
            fig.colorbar(image, cax=bar, label="attention weight")
    return save_figure(fig, path)


def _label_axis(axis, labels: list[str]) -> None:
    step = max(1, -(-len(labels) // 60))
    ticks = list(range(0, len(labels), step))
    axis.set_ticks(ticks)
    axis.set_ticklabels([labels[i] for i in ticks])
