"""What the inference commands (translate, generate, fill-mask, classify) share: loading a
checkpoint of the right family, reading texts, checking numeric flags with errors that name them."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch import nn

from aiayn.api import load_parts
from aiayn.cli.args import device
from aiayn.inference.precision import DTYPE_ALIASES, DTYPE_CHOICES, DTYPES
from aiayn.inference.quantization import QUANTIZATIONS
from aiayn.nn.cache import KV_AUTO, KV_DTYPES
from aiayn.pretrained import Pretrained
from aiayn.tokenization.base import Tokenizer, same_vocabulary

if TYPE_CHECKING:
    from aiayn.training.config import TrainConfig

__all__ = [
    "add_checkpoint_arguments", "load_model_for", "load_ensemble", "check_ensemble", "read_texts",
    "check_at_least", "check_range", "batches", "saved_train_config", "add_precision_arguments", "add_pack_argument", "precision_options",
    "check_compile",
]


def add_checkpoint_arguments(parser: argparse.ArgumentParser, *, ensemble: bool = False, compile: bool = False) -> None:
    """``--checkpoint DIR``, ``--device`` and the precision flags; with ``ensemble``, ``--checkpoint`` may be
    repeated (a list); with ``compile``, ``--compile`` too."""
    help_text = "a saved model directory, a training checkpoint, a run directory (its newest checkpoint), or a Hugging Face model directory"
    if ensemble:
        parser.add_argument("--checkpoint", required=True, action="append", metavar="DIR",
                            help=help_text + "; repeat it for an ensemble (the models' probabilities are averaged)")
    else:
        parser.add_argument("--checkpoint", required=True, metavar="DIR", help=help_text)
    parser.add_argument("--device", default="cpu", type=device, help="device to run on (default: cpu)")
    add_precision_arguments(parser, compile=compile)


def add_precision_arguments(parser: argparse.ArgumentParser, *, compile: bool = False) -> None:
    """The shared inference flags: ``--dtype``, ``--quantize`` (every command that loads a model) and,
    with ``compile``, ``--compile`` (commands that decode token by token)."""
    parser.add_argument("--dtype", choices=DTYPE_CHOICES, default=None,
                        help="cast the weights once at load; bf16 means bfloat16 (default: float32 as saved)")
    add_quantize_argument(parser)
    add_pack_argument(parser)
    if compile:
        parser.add_argument("--compile", action="store_true",
                            help="torch.compile the one-token decode step over a static KV cache")


def add_quantize_argument(parser: argparse.ArgumentParser) -> None:
    """``--quantize`` (``args.quantize``, default ``None``): the ``quantize`` of :func:`~aiayn.pretrained.load_pretrained`."""
    parser.add_argument("--quantize", choices=QUANTIZATIONS, default=None,
                        help="int8: int8 weight-only Linear layers with per-channel scales; int8-dynamic: the same weights, the "
                        "activations quantised to 8 bits at each call (FBGEMM); int4[-g64|-g128]: 4-bit weights, a scale "
                        "and zero per group of 32 (64, 128) inputs (default: none)")


# --kv-cache-dtype: the --dtype spellings of the dtypes a KV cache keeps (float32, bfloat16, fp32, bf16)
KV_CACHE_DTYPES = tuple(name for name in DTYPE_CHOICES if DTYPES[DTYPE_ALIASES.get(name, name)] in KV_DTYPES)


def add_kv_cache_argument(parser: argparse.ArgumentParser) -> None:
    """``--kv-cache-dtype`` (``args.kv_cache_dtype``, default ``"auto"``): the ``kv_dtype`` of a decoder-only model's
    :class:`~aiayn.decoding.adapters.CausalLMDecoder` (``aiayn generate``, ``aiayn serve``); read it with
    :func:`~aiayn.inference.precision.parse_kv_dtype`."""
    parser.add_argument("--kv-cache-dtype", choices=(KV_AUTO, *KV_CACHE_DTYPES), default=KV_AUTO,
                        help="decoder-only: keep the KV cache's keys and values in this dtype, read widened: bfloat16 under "
                             "float32 activations halves the cache's memory and what each step reads from it (default: auto, "
                             "bfloat16 for weight-only int8 and int4 weights under float32 activations, else the activations')")


def add_pack_argument(parser: argparse.ArgumentParser) -> None:
    """``--no-pack`` (``args.pack``, default ``True``): the ``pack`` of :func:`~aiayn.pretrained.load_pretrained`."""
    parser.add_argument("--no-pack", dest="pack", action="store_false",
                        help="keep each Linear weight once, not also in oneDNN's packed layout: half the memory of the "
                        "weights, slower matmuls of a few rows on the CPU (default: packed)")


def precision_options(args: argparse.Namespace) -> dict[str, Any]:
    """``dtype``, ``quantize`` and ``pack`` for :func:`~aiayn.pretrained.load_pretrained` from the parsed flags."""
    return {"dtype": getattr(args, "dtype", None), "quantize": getattr(args, "quantize", None), "pack": getattr(args, "pack", True)}


def check_compile(command: str) -> None:
    """Exit naming ``--compile`` unless ``torch.compile`` works here (compiles a one-line function)."""
    import torch

    try:
        torch.compile(lambda x: x * 2 + 1, fullgraph=True)(torch.ones(2))
    except Exception as e:  # noqa: BLE001 -- any failure of the toolchain means "cannot compile here"
        first = (str(e).splitlines() or [type(e).__name__])[0]
        raise SystemExit(
            f"aiayn {command}: --compile: torch {torch.__version__} cannot compile here ({first}); "
            "run without --compile (accepted: the flag given on a machine where torch.compile works, or absent)"
        ) from None


def load_model_for(
    command: str, args: argparse.Namespace, family: type[nn.Module], needs: str, path: str | None = None
) -> tuple[Pretrained, Tokenizer, Tokenizer]:
    """Load ``--checkpoint`` (or ``path``); exit with a message naming it unless it holds a ``family``
    model and tokenizers. ``needs`` completes the sentence "COMMAND needs ..." in the family error.
    """
    path = args.checkpoint if path is None else path
    try:  # ours, a checkpoint, a run directory, or a Hugging Face directory with its own tokenizer
        loaded = load_parts(path, device=args.device, **precision_options(args))
    except (OSError, ValueError, RuntimeError) as e:
        raise SystemExit(f"aiayn {command}: --checkpoint {path}: {e}") from None
    if not isinstance(loaded.model, family):
        raise SystemExit(f"aiayn {command}: --checkpoint {path} holds a {loaded.config.family} model; {command} needs {needs}")
    if loaded.src_tokenizer is None or loaded.tgt_tokenizer is None:
        raise SystemExit(f"aiayn {command}: --checkpoint {path} holds no tokenizer, so text cannot be encoded")
    return loaded, loaded.src_tokenizer, loaded.tgt_tokenizer


def load_ensemble(command: str, args: argparse.Namespace, family: type[nn.Module], needs: str) -> list[Pretrained]:
    """Load every ``--checkpoint`` (see :func:`load_model_for`); they must share their tokenizers."""
    members = [load_model_for(command, args, family, needs, path)[0] for path in args.checkpoint]
    check_ensemble(members)
    return members


def check_ensemble(members: list[Pretrained]) -> None:
    """Raise ``ValueError`` naming the first member whose family or tokenizers differ from the first
    member's (an ensemble is one kind of model reading and writing one vocabulary)."""
    first = members[0]
    for other in members[1:]:
        if type(other.model) is not type(first.model):
            raise ValueError(f"--checkpoint {other.path} holds a model of family {other.config.family}, {first.path} "
                             f"one of family {first.config.family}: ensemble members must be of one family")
        for side in ("src_tokenizer", "tgt_tokenizer"):
            if not same_vocabulary(getattr(other, side), getattr(first, side)):
                raise ValueError(
                    f"--checkpoint {other.path} has a different {side.replace('_', ' ')} from "
                    f"{first.path}: ensemble members must share their tokenizers (fine-tune them from one run)"
                )


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


def saved_train_config(path: str | Path) -> TrainConfig | None:
    """The training config saved in a model directory or checkpoint (never its parent's), if any.

    Its paths are untrusted: a command that reads them confines them first
    (:func:`aiayn.pretrained.confine_data_paths`)."""
    from aiayn.config_io import load_yaml
    from aiayn.training.config import TrainConfig

    candidate = Path(path) / "train_config.yaml"
    return load_yaml(candidate, TrainConfig) if candidate.exists() else None
