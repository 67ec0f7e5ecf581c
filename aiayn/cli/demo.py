"""``aiayn demo``: train a small translator on Multi30k and show what it does (the README's first command)."""

from __future__ import annotations

import argparse

from aiayn.cli.args import finite_float


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data-dir", help="where the data sets are (default: $AIAYN_DATA_DIR, then the user cache)")
    parser.add_argument("--run-dir", default="runs/demo", help="checkpoints and pictures go here (default: runs/demo)")
    parser.add_argument("--minutes", type=finite_float, default=9.0, help="training time budget in minutes (default: 9)")


def run(args: argparse.Namespace) -> int:
    from aiayn.cli import copy_task
    from aiayn.demo import run_demo

    if args.minutes <= 0:
        raise SystemExit(f"aiayn demo: --minutes must be > 0, got {args.minutes}")

    def fallback() -> int:
        return copy_task.run(argparse.Namespace(steps=1000, length=10, seed=0))

    return run_demo(run_dir=args.run_dir, data_dir=args.data_dir, minutes=args.minutes, fallback=fallback)
