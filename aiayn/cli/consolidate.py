"""``aiayn consolidate CHECKPOINT OUT``: a sharded (FSDP, DCP) checkpoint as the ordinary model directory."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", type=Path, metavar="CHECKPOINT", help="a sharded step-NNNNNN checkpoint, or its run directory")
    parser.add_argument("out", type=Path, metavar="OUT", help="the model directory to write")
    parser.add_argument("--overwrite", action="store_true", help="replace OUT if it exists")


def run(args: argparse.Namespace) -> int:
    from aiayn.checkpoint.directory import resolve_checkpoint
    from aiayn.checkpoint.sharded import consolidate

    checkpoint = resolve_checkpoint(args.checkpoint)
    out = consolidate(checkpoint, args.out, overwrite=args.overwrite)
    print(f"consolidated {checkpoint} into {out}")
    return 0
