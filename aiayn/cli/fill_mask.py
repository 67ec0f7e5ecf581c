"""``aiayn fill-mask``: the most likely tokens for each ``<mask>`` in a text, with an encoder-only checkpoint."""

from __future__ import annotations

import argparse

import torch

from aiayn.cli.inference import add_checkpoint_arguments, check_at_least, load_model_for
from aiayn.decoding.encoder_only import encode_masked_text, fill_mask
from aiayn.models.encoder_only import EncoderOnly
from aiayn.tokenization.special import MASK

HELP = f"predict the tokens hidden by {MASK} in a text with an encoder-only (BERT-style) checkpoint"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_checkpoint_arguments(parser)
    parser.add_argument("text", metavar="TEXT", help=f"a text with one or more {MASK}")
    parser.add_argument("--top-k", type=int, default=5, help="candidates per mask (default: 5)")


def run(args: argparse.Namespace) -> int:
    check_at_least("fill-mask", args, "top_k", 1)
    if MASK not in args.text:
        raise SystemExit(f"aiayn fill-mask: TEXT must contain {MASK}, got {args.text!r}")
    loaded, tokenizer, _ = load_model_for("fill-mask", args, EncoderOnly, "an encoder-only model")
    ids = encode_masked_text(tokenizer, args.text)
    batch = torch.tensor([ids], device=args.device)
    try:
        predictions = fill_mask(loaded.model, batch, top_k=args.top_k)[0]  # type: ignore[arg-type]
    except ValueError as e:
        raise SystemExit(f"aiayn fill-mask: {e}") from None
    filled = list(ids)
    for number, prediction in enumerate(predictions, start=1):
        candidates = ", ".join(
            f"{tokenizer.id_to_token(token)!r} {prob:.4f}" for token, prob in zip(prediction.token_ids, prediction.probs)
        )
        print(f"{MASK} {number}: {candidates}")
        filled[prediction.position] = prediction.token_ids[0]
    print(f"filled: {tokenizer.decode(filled)}")
    return 0
