"""``aiayn plot RUN_DIR [--out DIR]``: PNG training curves from a run's ``metrics.jsonl``."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="a training run directory (or its metrics.jsonl)")
    parser.add_argument("--out", type=Path, default=None, metavar="DIR", help="where the PNGs go (default: RUN_DIR/plots)")


def run(args: argparse.Namespace) -> int:
    from aiayn.viz.curves import plot_run  # imported here: keeps `aiayn --help` fast (no matplotlib)

    written = plot_run(args.run_dir, args.out)
    for path in written:
        print(f"wrote {path}")
    return 0
