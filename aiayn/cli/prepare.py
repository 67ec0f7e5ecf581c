"""``aiayn prepare CORPUS --out DIR``: tokenize a corpus once into memory-mapped shards that training reads."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("corpus", help="wmt14-en-de | multi30k (found or downloaded as the data sets are) | files (with --train/--val)")
    parser.add_argument("--out", required=True, help="the directory to write (resumes an interrupted prepare there)")
    parser.add_argument("--train", nargs=2, metavar=("SRC", "TGT"), help="corpus files: the training pairs, one sentence per line")
    parser.add_argument("--val", nargs=2, metavar=("SRC", "TGT"), help="corpus files: the validation pairs")
    parser.add_argument("--direction", help="source-target languages (wmt14-en-de: en-de; multi30k: de-en)")
    parser.add_argument("--data-dir", help="where the data sets are (default: $AIAYN_DATA_DIR, then the user cache)")
    parser.add_argument("--no-download", action="store_true", help="never download: say which files to put where")
    parser.add_argument("--tokenizer", help="a saved tokenizer (file or directory) to use instead of learning a BPE")
    parser.add_argument("--vocab-size", type=int, default=37_000, help="the BPE to learn: ids, specials included (default: 37000, the paper's)")
    parser.add_argument("--dtype", default="auto", choices=("auto", "uint16", "uint32"), help="token ids on disk (auto: uint16 when they fit)")
    parser.add_argument("--shard-lines", type=int, default=1_000_000, help="lines per shard, the unit of resuming (default: 1000000)")


def run(args: argparse.Namespace) -> int:
    from aiayn.data.prepared import PrepareSettings, corpus_files, prepare

    if args.corpus == "files":
        if not args.train or not args.val:
            raise ValueError("corpus 'files' needs --train SRC TGT and --val SRC TGT")
        splits = {"train": (Path(args.train[0]), Path(args.train[1])), "val": (Path(args.val[0]), Path(args.val[1]))}
    else:
        if args.train or args.val:
            raise ValueError(f"--train/--val are for corpus 'files'; {args.corpus!r} has its own files")
        splits = corpus_files(args.corpus, direction=args.direction, data_dir=args.data_dir, download=not args.no_download)
    settings = PrepareSettings(vocab_size=args.vocab_size, tokenizer=args.tokenizer, dtype=args.dtype, shard_lines=args.shard_lines)
    manifest_path = prepare(args.out, splits, settings)
    manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    for split, record in manifest["sources"].items():
        tokens = sum(s["tokens"] for side in ("src", "tgt") for s in manifest["shards"][f"{split}.{side}"])
        print(f"{split}: {record['lines']} pairs, {tokens} tokens")
    tok = manifest["tokenizer"]
    print(f"tokenizer: {tok['kind']} of {tok['vocab_size']} ids; shards: {manifest['settings']['shard_dtype']}")
    print(f"wrote {manifest_path}; train with --set data.prepared={args.out}")
    return 0
