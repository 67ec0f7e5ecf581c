"""``aiayn evaluate --checkpoint DIR --split NAME``: BLEU/chrF, perplexity or accuracy on a held-out split."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from aiayn.cli.args import finite_float
from aiayn.checkpoint.atomic_io import atomic_write_bytes
from aiayn.cli.inference import add_checkpoint_arguments, check_ensemble
from aiayn.config_io import load_yaml
from aiayn.data import load_multi30k, load_sst2, load_tinyshakespeare
from aiayn.decoding.beam import BeamConfig
from aiayn.evaluation import evaluate_classifier, evaluate_lm, evaluate_translation, translate_corpus
from aiayn.pretrained import load_pretrained
from aiayn.training.config import TrainConfig

HELP = "evaluate a checkpoint on a split: sacreBLEU + chrF (translation), perplexity (LM), accuracy (classification)"
SPLITS = {"multi30k": ("val", "test2016"), "tinyshakespeare": ("val",), "sst2": ("dev",)}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_checkpoint_arguments(parser, ensemble=True)
    parser.add_argument("--split", required=True, help="multi30k: val | test2016; tinyshakespeare: val; sst2: dev")
    parser.add_argument("--dataset", choices=sorted(SPLITS), help="default: the one the checkpoint was trained on")
    parser.add_argument("--direction", choices=("de-en", "en-de"), help="multi30k direction (default: as trained)")
    parser.add_argument("--data-dir", help="where the data sets are (default: $AIAYN_DATA_DIR, then the user cache)")
    parser.add_argument("--beam-size", type=int, default=4, help="translation beam size (default: 4, section 6.1)")
    parser.add_argument("--length-penalty", type=finite_float, default=0.6, help="alpha of the length penalty (default: 0.6)")
    parser.add_argument("--limit", type=int, help="evaluate only the first N examples (a quick look; not a result)")
    parser.add_argument("--out", help="write the metrics as JSON here (default: eval-DATASET-SPLIT.json)")
    parser.add_argument("--hypotheses", help="translation: also write the outputs here, one per line")


def run(args: argparse.Namespace) -> int:
    members = [load_pretrained(path, device=args.device) for path in args.checkpoint]
    loaded = members[0]
    check_ensemble(members)
    models = [m.model for m in members]
    trained = _train_config(Path(loaded.path))
    dataset = args.dataset or (trained.data.dataset if trained else None)
    if dataset not in SPLITS:
        raise ValueError(f"--dataset is needed: {args.checkpoint[0]} does not say which data set it was trained on (got {dataset!r})")
    if args.split not in SPLITS[dataset]:
        raise ValueError(f"--split {args.split!r} is not a held-out split of {dataset}; choose one of {SPLITS[dataset]}")
    if args.limit is not None and args.limit < 1:
        raise ValueError(f"--limit must be >= 1, got {args.limit}")
    tok = loaded.src_tokenizer
    if tok is None or loaded.tgt_tokenizer is None:
        raise ValueError(f"{loaded.path} holds no tokenizer, so text cannot be encoded")
    started = time.perf_counter()
    result: dict[str, Any] = {"checkpoint": str(loaded.path)} if len(members) == 1 else {"checkpoints": [str(m.path) for m in members]}
    result |= {"dataset": dataset, "split": args.split}
    if dataset == "multi30k":
        direction = args.direction or (trained.data.direction if trained else "de-en")
        pairs = load_multi30k(args.split, direction=direction, data_dir=args.data_dir)
        sources, references = pairs.src[: args.limit], pairs.tgt[: args.limit]
        beam = BeamConfig(beam_size=args.beam_size, length_penalty=args.length_penalty)
        hypotheses = translate_corpus(models, tok, loaded.tgt_tokenizer, sources, beam=beam)  # type: ignore[arg-type]
        result |= {"direction": direction, "beam_size": args.beam_size, "length_penalty": args.length_penalty}
        result |= evaluate_translation(hypotheses, references)
        if args.hypotheses:
            atomic_write_bytes(args.hypotheses, "".join(h + "\n" for h in hypotheses).encode())
    elif dataset == "tinyshakespeare":
        text = load_tinyshakespeare(args.split, data_dir=args.data_dir)
        block = trained.data.block_size if trained else loaded.config.max_len
        result |= {"block_size": block} | evaluate_lm(models, tok, text[: args.limit] if args.limit else text, block_size=block)  # type: ignore[arg-type]
    else:
        data = load_sst2(args.split, data_dir=args.data_dir)
        if args.limit:
            data = type(data)(data.texts[: args.limit], data.labels[: args.limit], data.label_names)
        max_len = trained.data.max_len if trained else loaded.config.max_len
        result |= evaluate_classifier(models, tok, data, max_len=max_len)  # type: ignore[arg-type]
    result["seconds"] = round(time.perf_counter() - started, 1)
    if args.limit:
        result["limit"] = args.limit
    _print_table(result)
    out = args.out or f"eval-{dataset}-{args.split}.json"
    atomic_write_bytes(out, (json.dumps(result, indent=2) + "\n").encode())
    print(f"wrote {out}")
    return 0


def _train_config(path: Path) -> TrainConfig | None:
    """The training config saved with a checkpoint (or beside an averaged model), if any."""
    for candidate in (path / "train_config.yaml", path.parent / "train_config.yaml"):
        if candidate.is_file():
            return load_yaml(candidate, TrainConfig)
    return None


def _print_table(result: dict[str, Any]) -> None:
    width = max(len(k) for k in result)
    for key, value in result.items():
        print(f"{key:<{width}}  {value}")
