"""``aiayn`` entry point: a table of subcommands, each a thin call into the library."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Callable

from aiayn import __version__
from aiayn.cli import bench, copy_task, explain, lab, train, viz
from aiayn.cli import classify, fill_mask, generate, translate
from aiayn.cli import convert, demo, evaluate
from aiayn.cli import average, listing, plot
from aiayn.cli import serve
from aiayn.cli import quantize
from aiayn.cli import consolidate

# name -> (help line, add_arguments, run)
COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]] = {
    "demo": (demo.HELP, demo.add_arguments, demo.run),
    "copy-task": (copy_task.HELP, copy_task.add_arguments, copy_task.run),
    "viz": (viz.HELP, viz.add_arguments, viz.run),
    "explain": (explain.HELP, explain.add_arguments, explain.run),
    "bench": (bench.HELP, bench.add_arguments, bench.run),
    "lab": (lab.HELP, lab.add_arguments, lab.run),
    "train": (train.HELP, train.add_arguments, train.run),
    "average-checkpoints": (average.HELP, average.add_arguments, average.run),
    "plot": (plot.HELP, plot.add_arguments, plot.run),
    "translate": (translate.HELP, translate.add_arguments, translate.run),
    "generate": (generate.HELP, generate.add_arguments, generate.run),
    "fill-mask": (fill_mask.HELP, fill_mask.add_arguments, fill_mask.run),
    "classify": (classify.HELP, classify.add_arguments, classify.run),
    "convert": (convert.HELP, convert.add_arguments, convert.run),
    "evaluate": (evaluate.HELP, evaluate.add_arguments, evaluate.run),
    "serve": (serve.HELP, serve.add_arguments, serve.run),
    "quantize": (quantize.HELP, quantize.add_arguments, quantize.run),
    "recipes": (listing.RECIPES_HELP, listing.add_no_arguments, listing.run_recipes),
    "presets": (listing.PRESETS_HELP, listing.add_no_arguments, listing.run_presets),
    "consolidate": (consolidate.HELP, consolidate.add_arguments, consolidate.run),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="aiayn",
        description="The Transformer of 'Attention Is All You Need' and its three families: build, train, decode, inspect.",
    )
    parser.add_argument("--version", action="version", version=f"aiayn {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (help_line, add_arguments, _) in COMMANDS.items():
        add_arguments(sub.add_parser(name, help=help_line, description=help_line))
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, format="%(message)s")
    if args.command is None:
        parser.print_help()
        return 0
    try:
        return COMMANDS[args.command][2](args)
    except (ValueError, TypeError, OSError, FloatingPointError) as e:
        if args.verbose:
            raise
        # A user's mistake (bad config, missing file, ...): the message says what and where; -v shows the trace.
        print(f"aiayn {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
