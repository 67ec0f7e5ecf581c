"""``aiayn fill-mask``: the most likely tokens for each mask in a text, with an encoder-only checkpoint."""

from __future__ import annotations

import argparse

from aiayn.cli.inference import add_checkpoint_arguments, check_at_least, load_model_for
from aiayn.decoding.text import fill_mask_text
from aiayn.models.encoder_only import EncoderOnly
from aiayn.tokenization.special import MASK, special_ids


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_checkpoint_arguments(parser)
    parser.add_argument("text", metavar="TEXT", help=f"a text with one or more {MASK} (or the tokenizer's own mask token)")
    parser.add_argument("--top-k", type=int, default=5, help="candidates per mask (default: 5)")


def run(args: argparse.Namespace) -> int:
    check_at_least("fill-mask", args, "top_k", 1)
    loaded, tokenizer, _ = load_model_for("fill-mask", args, EncoderOnly, "an encoder-only model")
    mask_id = special_ids(tokenizer).mask
    own = tokenizer.id_to_token(mask_id) if mask_id is not None else None
    if own is None:
        raise SystemExit(f"aiayn fill-mask: --checkpoint {args.checkpoint}: its tokenizer has no mask token")
    text = args.text.replace(MASK, own)  # <mask> always works; BERT's [MASK] too
    if own not in text:
        spelled = MASK if own == MASK else f"{MASK} or {own}"
        raise SystemExit(f"aiayn fill-mask: TEXT must contain {spelled}, got {args.text!r}")
    try:
        result = fill_mask_text(loaded.model, tokenizer, text, top_k=args.top_k, device=args.device)  # type: ignore[arg-type]
    except ValueError as e:
        raise SystemExit(f"aiayn fill-mask: {e}") from None
    for number, candidates in enumerate(result.candidates, start=1):
        print(f"{MASK} {number}: " + ", ".join(f"{token!r} {prob:.4f}" for token, prob in candidates))
    print(f"filled: {result.text}")
    return 0
