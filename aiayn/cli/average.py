"""``aiayn average-checkpoints RUN_DIR --last N --out DIR``: average the last N checkpoints into a loadable model."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="a training run directory holding step-NNNNNN checkpoints")
    parser.add_argument(
        "--last", type=int, default=5, metavar="N",
        help="how many of the newest complete checkpoints to average (default: 5, the paper's base models; big: 20)",
    )
    parser.add_argument("--out", type=Path, required=True, metavar="DIR", help="the model directory to write (must not exist)")


def run(args: argparse.Namespace) -> int:
    from aiayn.checkpoint.averaging import average_last
    from aiayn.checkpoint.state import CONFIG_FILE, MARKER, MODEL_FILE

    if args.last < 1:
        raise SystemExit(f"aiayn average-checkpoints: --last must be >= 1, got {args.last}")
    out = average_last(args.run_dir, args.last, args.out)
    marker = json.loads((out / MARKER).read_text(encoding="utf-8"))
    sources = marker["averaged_from"]
    print(f"averaged {len(sources)} checkpoints of {args.run_dir} ({sources[0]} .. {sources[-1]}) into {out}")
    extras = sorted(set(marker["files"]) - {MODEL_FILE, CONFIG_FILE})
    if extras:
        print(f"copied from {sources[-1]}: {', '.join(extras)}")
    print(f"load it with aiayn.pretrained.load_pretrained({str(out)!r}) or --checkpoint {out}")
    return 0
