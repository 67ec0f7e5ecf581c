"""What the inference commands (translate, generate, fill-mask, classify) share: loading a
checkpoint of the right family, reading texts, checking numeric flags with errors that name them."""

from __future__ import annotations

import argparse
import sys

from torch import nn

from aiayn.pretrained import Pretrained, load_pretrained
from aiayn.tokenization.base import Tokenizer

__all__ = ["add_checkpoint_arguments", "load_checkpoint", "read_texts", "check_at_least", "check_range", "batches"]


def add_checkpoint_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoint", required=True, metavar="DIR",
                        help="a saved model directory, a training checkpoint, or a run directory (its newest checkpoint)")
    parser.add_argument("--device", default="cpu", help="device to run on (default: cpu)")


def load_checkpoint(command: str, args: argparse.Namespace, family: type[nn.Module], needs: str) -> tuple[Pretrained, Tokenizer, Tokenizer]:
    """Load ``--checkpoint``; exit with a message naming it unless it holds a ``family`` model and tokenizers.

    ``needs`` completes the sentence "COMMAND needs ..." in the family error.
    """
    try:
        loaded = load_pretrained(args.checkpoint, device=args.device)
    except (OSError, ValueError, RuntimeError) as e:
        raise SystemExit(f"aiayn {command}: --checkpoint {args.checkpoint}: {e}") from None
    if not isinstance(loaded.model, family):
        raise SystemExit(
            f"aiayn {command}: --checkpoint {args.checkpoint} holds a {loaded.config.family} model; {command} needs {needs}"
        )
    if loaded.src_tokenizer is None or loaded.tgt_tokenizer is None:
        raise SystemExit(f"aiayn {command}: --checkpoint {args.checkpoint} holds no tokenizer, so text cannot be encoded")
    return loaded, loaded.src_tokenizer, loaded.tgt_tokenizer


def read_texts(command: str, texts: list[str]) -> list[str]:
    """The TEXT arguments, or else the lines of standard input (without their newlines)."""
    if texts:
        return texts
    if sys.stdin.isatty():
        raise SystemExit(f"aiayn {command}: give TEXT arguments or pipe lines on standard input")
    lines = [line.rstrip("\r\n") for line in sys.stdin]
    if not lines:
        raise SystemExit(f"aiayn {command}: standard input is empty: nothing to do")
    return lines


def check_at_least(command: str, args: argparse.Namespace, name: str, minimum: float) -> None:
    """Exit naming ``--name`` and its value unless it is ``None`` or ``>= minimum``."""
    value = getattr(args, name)
    if value is not None and value < minimum:
        raise SystemExit(f"aiayn {command}: --{name.replace('_', '-')} must be >= {minimum}, got {value}")


def check_range(command: str, args: argparse.Namespace, name: str, low: float, high: float, rule: str) -> None:
    """Exit naming ``--name`` and its value unless it is ``None`` or in ``(low, high]``."""
    value = getattr(args, name)
    if value is not None and not low < value <= high:
        raise SystemExit(f"aiayn {command}: --{name.replace('_', '-')} must be {rule}, got {value}")


def batches(items: list[str], size: int) -> list[list[str]]:
    return [items[i : i + size] for i in range(0, len(items), size)]
