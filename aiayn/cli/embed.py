"""``aiayn embed``: sentence embeddings of lines of text, with an encoder-only checkpoint, as ``.npy`` or JSON lines."""

from __future__ import annotations

import argparse
import io
import json
import sys
from pathlib import Path

from aiayn.checkpoint.atomic_io import atomic_write_bytes
from aiayn.cli.inference import add_checkpoint_arguments, check_at_least, load_model_for, read_texts
from aiayn.inference.embed import POOLINGS, embed_texts, embedding_pooling
from aiayn.models.encoder_only import EncoderOnly

_FORMATS = {".npy": "npy", ".jsonl": "jsonl", ".json": "jsonl"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_checkpoint_arguments(parser)
    parser.add_argument("text", nargs="*", metavar="TEXT", help="texts to embed (default: the lines of --input, else of stdin)")
    parser.add_argument("--input", metavar="FILE", help="embed each line of FILE (row i of the output is line i)")
    parser.add_argument("--output", metavar="PATH", help="X.npy: an (N, d_model) float32 matrix; X.jsonl: one JSON object per "
                        "line (default: JSON lines on stdout)")
    parser.add_argument("--pooling", choices=POOLINGS, default=None,
                        help="how token states become one vector (default: sentence-transformers' modules.json where the "
                        "checkpoint has one, else mean)")
    parser.add_argument("--no-normalize", dest="normalize", action="store_const", const=False, default=None,
                        help="keep the pooled vectors' length (default: as modules.json says, else unit length)")
    parser.add_argument("--batch-size", type=int, default=32, help="texts embedded together (default: 32)")


def run(args: argparse.Namespace) -> int:
    check_at_least("embed", args, "batch_size", 1)
    output = Path(args.output) if args.output else None
    kind = _output_kind(output)  # before any work
    texts = _texts(args)
    loaded, tokenizer, _ = load_model_for("embed", args, EncoderOnly, "an encoder-only model")
    pooling = embedding_pooling(loaded.model, loaded.path, pooling=args.pooling, normalize=args.normalize)  # type: ignore[arg-type]
    vectors = embed_texts(loaded.model, tokenizer, texts, pooling, batch_size=args.batch_size, device=args.device)  # type: ignore[arg-type]
    if kind == "npy":
        import numpy as np

        buffer = io.BytesIO()
        np.save(buffer, vectors.numpy())
        atomic_write_bytes(output, buffer.getvalue())  # type: ignore[arg-type]  # npy needs --output
        return 0
    lines = "".join(json.dumps({"index": i, "text": t, "embedding": v}) + "\n" for i, (t, v) in enumerate(zip(texts, vectors.tolist())))
    if output is None:
        sys.stdout.write(lines)
    else:
        atomic_write_bytes(output, lines.encode())
    return 0


def _output_kind(output: Path | None) -> str:
    if output is None:
        return "jsonl"
    kind = _FORMATS.get(output.suffix.lower())
    if kind is None:
        raise SystemExit(f"aiayn embed: --output {output}: the name must end in one of {sorted(_FORMATS)} (.npy: a matrix, .jsonl: JSON lines)")
    if not output.parent.is_dir():
        raise SystemExit(f"aiayn embed: --output {output}: the directory {output.parent} does not exist")
    return kind


def _texts(args: argparse.Namespace) -> list[str]:
    if args.input is None:
        return read_texts("embed", args.text)
    if args.text:
        raise SystemExit("aiayn embed: give TEXT arguments or --input FILE, not both")
    try:
        with open(args.input, encoding="utf-8") as file:  # lines as stdin gives them: split at newlines only
            lines = [line.rstrip("\r\n") for line in file]
    except (OSError, UnicodeDecodeError) as e:
        raise SystemExit(f"aiayn embed: --input {args.input}: {e}") from None
    if not lines:
        raise SystemExit(f"aiayn embed: --input {args.input} is empty: nothing to embed")
    return lines
