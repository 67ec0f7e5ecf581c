"""``aiayn evaluate --checkpoint DIR --split NAME`` (or ``--files PATH [PATH]``): the metric of the
checkpoint's task on a held-out split or on any files in the task's format."""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path
from typing import Any

from aiayn.checkpoint.atomic_io import atomic_write_bytes
from aiayn.checkpoint.directory import MARKER
from aiayn.cli.args import finite_float
from aiayn.cli.inference import add_checkpoint_arguments, check_ensemble, precision_options, saved_train_config
from aiayn.data.datasets import SST2_LABELS
from aiayn.decoding.beam import BeamConfig
from aiayn.evaluation.held_out import DEFAULT_DIRECTION, HELD_OUT_SPLITS, NATURAL_TASK, evaluate_held_out
from aiayn.pretrained import Pretrained, confine_data_paths, load_pretrained
from aiayn.training.config import DataSection, TrainConfig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_checkpoint_arguments(parser, ensemble=True)
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--split",
                       help="multi30k: val | test2016; tinyshakespeare: val; sst2: dev; your own files: val (data.val_files, "
                            "or the 10%% held out) | test (data.test_files)")
    which.add_argument("--files", nargs="+", metavar="PATH",
                       help="score these files, in the task's format: SRC TGT or PAIRS (translation), TEXT (lm), TABLE "
                            "(classification, mlm); the columns and header settings are the training config's")
    parser.add_argument("--dataset", choices=sorted(NATURAL_TASK), help="default: the one the checkpoint was trained on")
    parser.add_argument("--direction", choices=("de-en", "en-de"), help="translation direction (default: as trained; without a training config, multi30k de-en, "
                             "wmt14-en-de en-de)")
    parser.add_argument("--data-dir", help="where the data sets are (default: as trained, then $AIAYN_DATA_DIR, then the user cache)")
    parser.add_argument("--beam-size", type=int, default=None,
                        help="translation beam size (default: the model's decode.beam_size, else 4 as in section 6.1)")
    parser.add_argument("--length-penalty", type=finite_float, default=None,
                        help="alpha of the length penalty (default: the model's decode.length_penalty, else 0.6)")
    parser.add_argument("--limit", type=int, help="evaluate only the first N examples (a quick look; not a result)")
    parser.add_argument("--out", help="write the metrics as JSON here (default: eval-CHECKPOINT-SPLIT.json or "
                                      "eval-CHECKPOINT-FILES.json in the run directory, never over another evaluation's)")
    parser.add_argument("--hypotheses", help="translation: also write the outputs here, one per line")


def run(args: argparse.Namespace) -> int:
    members = [load_pretrained(path, device=args.device, **precision_options(args)) for path in args.checkpoint]
    loaded = members[0]
    check_ensemble(members)
    if args.limit is not None and args.limit < 1:
        raise ValueError(f"--limit must be >= 1, got {args.limit}")
    tok = loaded.src_tokenizer
    if tok is None or loaded.tgt_tokenizer is None:
        raise ValueError(f"{loaded.path} holds no tokenizer, so text cannot be encoded")
    trained = saved_train_config(loaded.path)
    data = _data_section(args, loaded, trained)
    started = time.perf_counter()
    result: dict[str, Any] = {"checkpoint": str(loaded.path)} if len(members) == 1 else {"checkpoints": [str(m.path) for m in members]}
    if args.files:
        result["files"] = [str(Path(f).resolve()) for f in args.files]
    else:
        result |= {"dataset": data.dataset, "split": args.split}
    result["task"] = data.task
    beam = BeamConfig(**loaded.decode.beam(args.beam_size, args.length_penalty))
    scored = evaluate_held_out([m.model for m in members], tok, loaded.tgt_tokenizer, data, args.split, files=args.files,
                               label_names=_model_labels(data, loaded, trained), beam=beam, limit=args.limit, progress=True)
    result |= scored.metrics
    if args.hypotheses and scored.hypotheses:
        atomic_write_bytes(args.hypotheses, "".join(h + "\n" for h in scored.hypotheses).encode())
    result["seconds"] = round(time.perf_counter() - started, 1)
    if args.limit:
        result["limit"] = args.limit
    _print_table(result)
    out = Path(args.out) if args.out else _out_path(_run_dir(loaded), result, members)
    existed = out.exists()
    atomic_write_bytes(out, (json.dumps(result, indent=2) + "\n").encode())
    print(f"wrote {out}" + (" (replacing the earlier results there)" if existed else ""))
    return 0


def _data_section(args: argparse.Namespace, loaded: Pretrained, trained: TrainConfig | None) -> DataSection:
    """The data to evaluate on: the training config's (``trained``) data section (own files, data_dir, direction,
    task) with the flags given on top; without a training config, ``--dataset`` and its natural task.
    The config's paths must lie inside ``--checkpoint`` (untrusted input) unless the flags replace them."""
    if trained is None and args.files and args.dataset is None:
        return DataSection(task=_FAMILY_TASK[loaded.config.family], dataset="files", train_files=list(args.files),
                           max_len=loaded.config.max_len, block_size=loaded.config.max_len)
    if trained is None:
        if args.dataset is None:
            raise ValueError(f"--dataset is needed: {args.checkpoint[0]} has no training config that says which data "
                             f"set it was trained on; choose one of {sorted(NATURAL_TASK)}")
        max_len = loaded.config.max_len
        return DataSection(task=NATURAL_TASK[args.dataset], dataset=args.dataset, direction=args.direction or DEFAULT_DIRECTION.get(args.dataset, "de-en"),
                           data_dir=args.data_dir, max_len=max_len, block_size=max_len)
    data = trained.data
    changes: dict[str, Any] = {}
    if args.dataset is not None and args.dataset != data.dataset:
        changes |= {"dataset": args.dataset, "task": NATURAL_TASK[args.dataset] if data.task != "mlm" else "mlm"}
    if args.direction is not None:
        changes["direction"] = args.direction
    if args.data_dir is not None:
        changes["data_dir"] = args.data_dir
    data = dataclasses.replace(data, **changes)
    given = {"data.data_dir"} if args.data_dir is not None else set()
    given |= {"data.val_files", "data.test_files"} if args.files else set()
    if args.files and loaded.labels is not None:  # the class names come from labels.json, not data.train_files
        given.add("data.train_files")
    data = confine_data_paths(data, args.checkpoint[0], Path(loaded.path) / "train_config.yaml", given=given)
    if args.files:
        return data
    if args.split not in HELD_OUT_SPLITS[data.dataset]:
        raise ValueError(f"--split {args.split!r} is not a held-out split of {data.dataset}; choose one of {HELD_OUT_SPLITS[data.dataset]}")
    return data


_FAMILY_TASK = {"encoder-decoder": "translation", "decoder-only": "lm", "encoder-only": "classification"}  # no training config
_IDENTITY = ("checkpoint", "checkpoints", "dataset", "split", "files", "limit", "beam_size", "length_penalty")


def _model_labels(data: DataSection, loaded: Pretrained, trained: TrainConfig | None) -> list[str] | None:
    """A classifier's classes as its data files write them (SST-2's files write 0/1 for negative/positive)."""
    if data.task != "classification":
        return None
    if trained is not None and trained.data.dataset == "sst2":
        return list(SST2_LABELS)
    return loaded.labels


def _out_path(run_dir: Path, result: dict[str, Any], members: list[Pretrained]) -> Path:
    """``eval-CHECKPOINT-SPLIT.json`` (or ``-FILES``): replaces only a result of the same evaluation;
    another one at that name (other files with the same names, another --limit) gets ``-2``, ``-3``..."""
    model = Path(members[0].path).name if len(members) == 1 else f"ensemble{len(members)}-" + "+".join(Path(m.path).name for m in members)
    what = "+".join(Path(f).name for f in result["files"]) if "files" in result else f"{result['dataset']}-{result['split']}"
    stem = f"eval-{model}-{what}" + (f"-limit{result['limit']}" if result.get("limit") else "")
    identity = {k: result.get(k) for k in _IDENTITY}
    for n in range(1, 1000):
        out = run_dir / (f"{stem}.json" if n == 1 else f"{stem}-{n}.json")
        if not out.exists() or _identity(out) == identity:
            return out
    raise ValueError(f"{run_dir} holds 999 evaluations named {stem}-N.json: pass --out")


def _identity(path: Path) -> dict[str, Any] | None:
    try:
        earlier = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return {k: earlier.get(k) for k in _IDENTITY} if isinstance(earlier, dict) else None


def _run_dir(loaded: Pretrained) -> Path:
    """Where results about a model go: a training checkpoint's run directory, else the model directory."""
    path = Path(loaded.path)
    return path.parent if (path / MARKER).is_file() else path


def _print_table(result: dict[str, Any]) -> None:
    width = max(len(k) for k in result)
    for key, value in result.items():
        print(f"{key:<{width}}  {value}")
