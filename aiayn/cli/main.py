"""``aiayn`` entry point: a table of subcommands, each a thin call into the library."""

from __future__ import annotations

import argparse
import difflib
import logging
import os
import sys
from typing import Callable

from aiayn import __version__
from aiayn.cli import (
    average,
    bench,
    classify,
    consolidate,
    convert,
    copy_task,
    demo,
    embed,
    evaluate,
    explain,
    fill_mask,
    generate,
    lab,
    listing,
    plot,
    prepare,
    quantize,
    serve,
    train,
    translate,
    viz,
)

# name -> (help line, add_arguments, run)
COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]] = {
    "demo": (demo.HELP, demo.add_arguments, demo.run),
    "copy-task": (copy_task.HELP, copy_task.add_arguments, copy_task.run),
    "viz": (viz.HELP, viz.add_arguments, viz.run),
    "explain": (explain.HELP, explain.add_arguments, explain.run),
    "bench": (bench.HELP, bench.add_arguments, bench.run),
    "lab": (lab.HELP, lab.add_arguments, lab.run),
    "prepare": (prepare.HELP, prepare.add_arguments, prepare.run),
    "train": (train.HELP, train.add_arguments, train.run),
    "average-checkpoints": (average.HELP, average.add_arguments, average.run),
    "plot": (plot.HELP, plot.add_arguments, plot.run),
    "translate": (translate.HELP, translate.add_arguments, translate.run),
    "generate": (generate.HELP, generate.add_arguments, generate.run),
    "fill-mask": (fill_mask.HELP, fill_mask.add_arguments, fill_mask.run),
    "classify": (classify.HELP, classify.add_arguments, classify.run),
    "embed": (embed.HELP, embed.add_arguments, embed.run),
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
    for each in _all_parsers(parser):
        each.allow_abbrev = False  # --beam would silently mean --beam-size; a typo must not pass as a prefix
    return parser


def _subparser_actions(parser: argparse.ArgumentParser) -> list[argparse._SubParsersAction]:
    return [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]


def _all_parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """``parser`` and every subcommand parser under it."""
    found = [parser]
    for action in _subparser_actions(parser):
        for child in action.choices.values():
            found += _all_parsers(child)
    return found


def _command_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The parser of the (sub)command ``args`` chose, e.g. ``bench attention``'s."""
    for action in _subparser_actions(parser):
        name = getattr(args, action.dest, None)
        if name in action.choices:
            return _command_parser(action.choices[name], args)
    return parser


def _reject_unknown(parser: argparse.ArgumentParser, args: argparse.Namespace, extras: list[str]) -> None:
    """Exit with the subcommand's usage and a "did you mean" for each unknown flag (argparse reports them
    at the top level, with the top-level usage)."""
    command = _command_parser(parser, args)
    flags = [s for a in command._actions for s in a.option_strings]
    hints = []
    for extra in extras:
        close = difflib.get_close_matches(extra.split("=")[0], flags, n=1) if extra.startswith("-") else []
        if close:
            hints.append(f"{extra.split('=')[0]} -> did you mean {close[0]}?")
    command.error(f"unrecognized arguments: {' '.join(extras)}" + (f" ({'; '.join(hints)})" if hints else ""))


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extras = parser.parse_known_args(argv)
    if extras:
        _reject_unknown(parser, args, extras)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, format="%(message)s")
    if args.command is None:
        parser.print_help()
        return 0
    try:
        return COMMANDS[args.command][2](args)
    except BrokenPipeError:
        # The reader went away (`aiayn explain | head`): stop quietly, as Python's docs recommend.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except (ValueError, TypeError, OSError, FloatingPointError) as e:
        if args.verbose:
            raise
        # A user's mistake (bad config, missing file, ...): the message says what and where; -v shows the trace.
        print(f"aiayn {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
