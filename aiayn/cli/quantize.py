"""``aiayn quantize``: write an int8 or int4 weight-only copy of a model directory (loads back with ``--checkpoint``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from aiayn.inference.quantization import QUANTIZATIONS
from aiayn.pretrained import MODEL_FILE, load_pretrained, own_files, save_pretrained


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoint", required=True, metavar="DIR", help="a model directory, a training checkpoint or a run directory")
    parser.add_argument("--to", required=True, metavar="DIR", help="the directory to write (weights, config, tokenizers)")
    parser.add_argument("--method", choices=QUANTIZATIONS[1:], default="int8", help="the quantisation: int8 (weight-only), int8-dynamic (the same weights, activations quantised to 8 bits at each call), or int4 with a scale per 32 inputs (-g64, -g128: fewer scales) (default: int8)")
    parser.add_argument("--overwrite", action="store_true", help="replace --to if it exists")


def run(args: argparse.Namespace) -> int:
    target = Path(args.to)
    if target.exists() and not args.overwrite:
        raise SystemExit(f"aiayn quantize: --to {target} exists; pass --overwrite to replace it")
    try:
        loaded = load_pretrained(args.checkpoint, quantize=args.method)
    except (OSError, ValueError, RuntimeError) as e:
        raise SystemExit(f"aiayn quantize: --checkpoint {args.checkpoint}: {e}") from None
    save_pretrained(target, loaded.model, loaded.src_tokenizer, loaded.tgt_tokenizer, overwrite=args.overwrite,
                    extra_files=own_files(loaded.path))
    before, after = (loaded.path / MODEL_FILE).stat().st_size, (target / MODEL_FILE).stat().st_size
    print(f"wrote {target}: {MODEL_FILE} {before / 1e6:.2f} MB -> {after / 1e6:.2f} MB ({args.method})")
    return 0
