"""``aiayn convert``: a local Hugging Face model directory <-> an aiayn model directory (no downloads)."""

from __future__ import annotations

import argparse

from aiayn.interop.convert import convert_from_hf, convert_to_hf
from aiayn.interop.registry import ARCHITECTURES


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--from-hf", metavar="DIR", help="Hugging Face directory to import (config.json + model.safetensors)")
    parser.add_argument("--to", metavar="DIR", help="aiayn model directory to write (with --from-hf)")
    parser.add_argument("--to-hf", metavar="DIR", help="Hugging Face directory to write (with --from)")
    parser.add_argument("--from", dest="from_dir", metavar="DIR", help="aiayn model directory to export (with --to-hf)")
    parser.add_argument(
        "--architecture", choices=list(ARCHITECTURES), metavar="CLASS",
        help=f"Hugging Face class: overrides config.json on import, picks the class on export; one of {', '.join(ARCHITECTURES)}",
    )
    parser.add_argument("--overwrite", action="store_true", help="replace the output directory if it exists")


def run(args: argparse.Namespace) -> int:
    importing = args.from_hf is not None or args.to is not None
    exporting = args.to_hf is not None or args.from_dir is not None
    if importing == exporting or (importing and None in (args.from_hf, args.to)) or (exporting and None in (args.to_hf, args.from_dir)):
        raise SystemExit("aiayn convert: give either --from-hf DIR --to DIR (import) or --to-hf DIR --from DIR (export)")
    if importing:
        imported = convert_from_hf(args.from_hf, args.to, architecture=args.architecture, overwrite=args.overwrite)
        print(f"imported {imported.architecture} into the {imported.config.family} family -> {args.to}")
        if imported.dropped:
            print(f"dropped (no counterpart, see the log): {', '.join(imported.dropped)}")
        print("tokenizer: converted" if imported.tokenizer is not None else f"tokenizer: none ({imported.tokenizer_note})")
        return 0
    exported, note = convert_to_hf(args.from_dir, args.to_hf, architecture=args.architecture, overwrite=args.overwrite)
    print(f"exported as {exported.architecture} -> {args.to_hf} (load with transformers.{exported.architecture}.from_pretrained)")
    print("tokenizer: tokenizer.json written" if note is None else f"tokenizer: none ({note})")
    return 0
