"""``aiayn viz attention|positional``: pictures of attention weights and of the positional encoding."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from aiayn.tokenization.base import Tokenizer


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="viz_command", metavar="WHAT", required=True)

    att = sub.add_parser(
        "attention", help="attention weights of a model on a text, per layer and head",
        description="Attention weights (math backend) of every layer and head: one PNG grid per kind of "
        "attention, or with --html one self-contained HTML page to explore them.",
    )
    model = att.add_mutually_exclusive_group(required=True)
    model.add_argument("--checkpoint", type=Path, metavar="DIR", help="a saved model directory (save_pretrained), training checkpoint, or Hugging Face model directory")
    model.add_argument("--preset", metavar="NAME", help="an untrained preset with a tiny character tokenizer built from the text")
    att.add_argument("--text", required=True, help="the input (source) text")
    att.add_argument(
        "--target", help="encoder-decoder only: the target text (default: the model's greedy output for "
        "--checkpoint; the text itself for an untrained --preset, whose greedy output is noise)",
    )
    att.add_argument("--max-target-len", type=int, default=64, help="longest greedy target, in tokens (default: 64)")
    att.add_argument("--out", type=Path, default=Path("viz"), help="output directory (default: viz)")
    att.add_argument("--html", action="store_true", help="write one HTML explorer (attention.html) instead of PNGs")
    att.add_argument("--seed", type=int, default=0, help="initialisation seed for --preset (default: 0)")

    pos = sub.add_parser(
        "positional", help="the sinusoidal positional encoding as a heatmap, and its dot product against distance",
        description="The sinusoidal positional encoding (paper section 3.5) as a heatmap, and PE(p).PE(p+k) against k.",
    )
    pos.add_argument("--d-model", type=int, default=128, help="model width (default: 128)")
    pos.add_argument("--max-len", type=int, default=50, help="number of positions (default: 50)")
    pos.add_argument("--out", type=Path, default=Path("viz"), help="output directory (default: viz)")


def run(args: argparse.Namespace) -> int:
    if args.viz_command == "positional":
        return _positional(args)
    return _attention(args)


def _positional(args: argparse.Namespace) -> int:
    from aiayn.viz.positional import plot_positional

    for name in ("d_model", "max_len"):
        if getattr(args, name) < 2:
            raise SystemExit(f"aiayn viz positional: --{name.replace('_', '-')} must be >= 2, got {getattr(args, name)}")
    if args.d_model % 2:
        raise SystemExit(f"aiayn viz positional: --d-model must be even (sines and cosines come in pairs), got {args.d_model}")
    summary = plot_positional(args.d_model, args.max_len, args.out / "positional.png")
    print(f"wrote {summary.path}")
    print(f"PE(p).PE(p) = {summary.dot_at_zero:.2f} (= d_model/2); at distance {args.max_len - 1}: {summary.dot_at_max:.2f}")
    print(f"largest change of PE(p).PE(p+k) with the start p: {summary.max_deviation:.1e} (a function of the distance k alone)")
    return 0


def _attention(args: argparse.Namespace) -> int:
    import torch

    from aiayn.models.encoder_decoder import EncoderDecoder
    from aiayn.viz.attention import collect_attention, plot_attention_grid

    if not args.text:
        raise SystemExit("aiayn viz attention: --text must not be empty")
    if args.max_target_len < 1:
        raise SystemExit(f"aiayn viz attention: --max-target-len must be >= 1, got {args.max_target_len}")
    if args.preset is not None:
        from aiayn.models.presets import PRESETS, build_model
        from aiayn.tokenization.char import CharTokenizer

        if args.preset not in PRESETS:
            raise SystemExit(f"aiayn viz attention: unknown preset {args.preset!r}; valid presets: {', '.join(PRESETS)}")
        tokenizer = CharTokenizer.train([args.text] + ([args.target] if args.target else []))
        torch.manual_seed(args.seed)
        model = build_model(args.preset, vocab_size=tokenizer.vocab_size)
        src_tok: Tokenizer = tokenizer
        tgt_tok: Tokenizer | None = tokenizer
        source = f"untrained preset {args.preset} (seed {args.seed}) with a {tokenizer.vocab_size}-symbol character vocabulary"
    else:
        from aiayn.api import load_parts  # ours, or a Hugging Face directory with its own tokenizer

        try:
            loaded = load_parts(args.checkpoint)
        except (FileNotFoundError, ValueError) as e:
            raise SystemExit(f"aiayn viz attention: {e}") from None
        if loaded.src_tokenizer is None:
            raise SystemExit(f"aiayn viz attention: {loaded.path} holds no tokenizer, so the text cannot be encoded")
        model, src_tok, tgt_tok = loaded.model, loaded.src_tokenizer, loaded.tgt_tokenizer
        source = f"checkpoint {loaded.path}"
    if args.target is not None and not isinstance(model, EncoderDecoder):
        raise SystemExit(f"aiayn viz attention: --target needs an encoder-decoder model, got {type(model).__name__}")

    target = args.target
    if target is None and args.preset is not None and isinstance(model, EncoderDecoder):
        target = args.text
        print("target: the text itself (an untrained model's greedy output would be noise)")
    views, target = collect_attention(
        model, src_tok, args.text, target=target, tgt_tokenizer=tgt_tok, max_target_len=args.max_target_len
    )
    if isinstance(model, EncoderDecoder) and args.target is None and args.preset is None:
        print(f"target (the model's greedy output): {target!r}")
    if args.html:
        from aiayn.viz.explorer import write_explorer

        subtitle = f"{source}; text: {args.text!r}" + (f"; target: {target!r}" if target is not None else "")
        path = write_explorer(views, args.out / "attention.html", title=f"attention of {type(model).__name__}", subtitle=subtitle)
        print(f"wrote {path}")
        return 0
    for view in views:
        layers, heads, _, _ = view.weights.shape
        path = plot_attention_grid(view, args.out / f"attention_{view.name}.png", title=f"{view.title} ({source})")
        print(f"wrote {path} ({layers} layers x {heads} heads)")
    return 0
