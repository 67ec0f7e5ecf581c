"""``aiayn`` entry point: a table of subcommands, each a thin call into the library."""

from __future__ import annotations

import argparse
import difflib
import importlib
import logging
import os
import sys
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

from aiayn import __version__
from aiayn.tokenization.special import MASK


@dataclass(frozen=True)
class Command:
    """A subcommand: its help line, and where its arguments and its run are: ``aiayn.cli.<module>``, imported only when
    the command is parsed (importing one imports torch, a second or more that ``aiayn --help``, ``--version`` and a
    mistyped command need not wait for)."""

    help: str
    module: str
    add_arguments: str = "add_arguments"
    run: str = "run"

    def entry(self, attr: str) -> Callable[..., Any]:
        return getattr(importlib.import_module(f"aiayn.cli.{self.module}"), attr)


COMMANDS: dict[str, Command] = {
    "demo": Command("train a small Multi30k German->English model, print its test BLEU and translations, draw its attention", "demo"),
    "copy-task": Command("train a tiny encoder-decoder on the copy task (a one-minute end-to-end check)", "copy_task"),
    "viz": Command("draw attention weights (PNG grids or an HTML explorer) or the sinusoidal positional encoding", "viz"),
    "explain": Command("trace one forward pass stage by stage: shapes, parameters, FLOPs, activation memory", "explain"),
    "bench": Command("benchmark attention (math, sdpa) against an LSTM and a convolution as the sequence grows", "bench"),
    "lab": Command("run an experiment that tests a claim about the Transformer (scaling, prenorm, positions, heads, smoothing, efficient)", "lab"),
    "prepare": Command("tokenize a translation corpus once into token-id shards (train with data.prepared=DIR)", "prepare"),
    "train": Command("train a model from a YAML config (resumes the run directory's newest checkpoint)", "train"),
    "average-checkpoints": Command("average the weights of a run's last N checkpoints (paper: 5 for base models, 20 for big) into a model directory", "average"),
    "plot": Command("draw a training run's curves (loss, validation loss, learning rate, gradient norm, ...) as PNG files", "plot"),
    "translate": Command("translate text (arguments, or lines on stdin) with an encoder-decoder checkpoint; beam search as its recipe chose (else beam 4, alpha 0.6)", "translate"),
    "generate": Command("continue a prompt with a decoder-only checkpoint (sampling or greedy), streaming to the terminal", "generate"),
    "fill-mask": Command(f"predict the tokens hidden by {MASK} (or the model's own mask, e.g. [MASK]) in a text with an encoder-only checkpoint", "fill_mask"),
    "classify": Command("classify texts (arguments, or lines on stdin) with an encoder-only checkpoint; prints LABEL<TAB>PROB<TAB>TEXT", "classify"),
    "embed": Command("sentence embeddings of texts (arguments, lines of --input, or lines on stdin) with an encoder-only checkpoint; "
                     "writes JSON lines (stdout or --output X.jsonl) or a float32 matrix (--output X.npy)", "embed"),
    "convert": Command("convert between a local Hugging Face model directory and an aiayn model directory (GPT-2, GPT-NeoX, BERT, "
                       "RoBERTa-PreLayerNorm, Marian, BART, mBART)", "convert"),
    "evaluate": Command("evaluate a checkpoint on a split: sacreBLEU + chrF (translation), perplexity (LM), masked-token or class accuracy", "evaluate"),
    "serve": Command("serve a checkpoint over HTTP: OpenAI-style endpoints with streaming and request batching, metrics, a page at /", "serve"),
    "quantize": Command("write an int8 (per-channel scales) or int4 (per-group scales) copy of a model as safetensors", "quantize"),
    "recipes": Command("list the packaged training recipes (aiayn train NAME runs one)", "listing", "add_no_arguments", "run_recipes"),
    "presets": Command("list the model presets (build_model(NAME), model.preset in a recipe)", "listing", "add_no_arguments", "run_presets"),
    "consolidate": Command("write a sharded checkpoint (train.parallel=fsdp) as an ordinary model directory (model.safetensors)", "consolidate"),
}


def build_parser(commands: Collection[str] | None = None) -> argparse.ArgumentParser:
    """The ``aiayn`` parser: every subcommand with its help line, and the arguments of those in ``commands`` (all of
    them when None; :func:`main` passes the one on its command line)."""
    parser = argparse.ArgumentParser(
        prog="aiayn",
        description="The Transformer of 'Attention Is All You Need' and its three families: build, train, decode, inspect.",
    )
    parser.add_argument("--version", action="version", version=f"aiayn {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, command in COMMANDS.items():
        child = sub.add_parser(name, help=command.help, description=command.help)
        if commands is None or name in commands:
            command.entry(command.add_arguments)(child)
    for each in _all_parsers(parser):
        each.allow_abbrev = False  # --beam would silently mean --beam-size; a typo must not pass as a prefix
    return parser


def _named_command(argv: Sequence[str]) -> list[str]:
    """The subcommand ``argv`` names (its first word that is not a flag: the top-level flags take no value), or none."""
    words = [w for w in argv if not w.startswith("-")]
    return words[:1] if words and words[0] in COMMANDS else []


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
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(_named_command(argv))
    args, extras = parser.parse_known_args(argv)
    if extras:
        _reject_unknown(parser, args, extras)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, format="%(message)s")
    if args.command is None:
        parser.print_help()
        return 0
    try:
        command = COMMANDS[args.command]
        return command.entry(command.run)(args)
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
