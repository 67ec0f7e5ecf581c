"""``aiayn train CONFIG [--set key=value ...]``: train from a YAML recipe, resuming when the run has checkpoints."""

from __future__ import annotations

import argparse
import os
import sys

from aiayn.config_io import apply_overrides, load_yaml
from aiayn.training.config import TrainConfig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="a YAML training config, or the name of a packaged recipe (see `aiayn recipes`)")
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help="override a config value by its dotted key, e.g. --set optim.lr=5e-4 (repeatable)",
    )
    parser.add_argument("--run-dir", help="where checkpoints and metrics go (default: the config's run_dir)")
    parser.add_argument("--data-dir", help="where the data sets are (default: $AIAYN_DATA_DIR, then the user cache)")
    parser.add_argument("--init-from", metavar="DIR",
                        help="start from this model directory (ours or Hugging Face's, with its tokenizer): sets train.init_from")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--resume", metavar="PATH", help="resume from this checkpoint or run directory")
    group.add_argument("--fresh", action="store_true", help="start from scratch (the run directory must hold no checkpoint)")


def run(args: argparse.Namespace) -> int:
    from aiayn.recipes import resolve_config_path
    from aiayn.training.loop import TrainingInterrupted, train  # imported here: keeps `aiayn --help` fast

    overrides = list(args.overrides)
    if args.run_dir:
        overrides.append(f"run_dir={args.run_dir}")
    if args.data_dir:
        overrides.append(f"data.data_dir={args.data_dir}")
    if args.init_from:
        overrides.append(f"train.init_from={args.init_from}")
    config = apply_overrides(load_yaml(resolve_config_path(args.config), TrainConfig), overrides)
    resume: bool | str = args.resume or (False if args.fresh else "auto")
    try:
        result = train(config, resume=resume)
    except TrainingInterrupted as stop:  # SIGINT/SIGTERM: the step finished and was saved
        if os.environ.get("RANK", "0") == "0":
            print(f"aiayn train: {stop}; resume with the same command", file=sys.stderr, flush=True)
        return stop.exit_code  # 130 for SIGINT, 143 for SIGTERM, as a shell expects of a signalled process
    if os.environ.get("RANK", "0") != "0":
        return 0  # under torchrun, rank 0 reports
    summary = ", ".join(f"{k} {v:.4f}" for k, v in result.metrics.items())
    print(f"done: step {result.step} in {result.run_dir}" + (f" ({summary})" if summary else ""))
    if result.last_checkpoint is not None:
        print(f"last checkpoint: {result.last_checkpoint}")
    return 0
