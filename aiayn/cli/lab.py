"""``aiayn lab NAME``: run one of the experiments that test the tutorials' claims, and print its verdict."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from aiayn.checkpoint.atomic_io import atomic_write_bytes


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from aiayn.lab import LABS

    parser.add_argument("name", choices=[*LABS, "all"], metavar="NAME",
                        help="; ".join(f"{k}: {v}" for k, v in LABS.items()) + "; all: every one in turn")
    parser.add_argument("--quick", action="store_true", help="tiny sizes (seconds; for tests, not for conclusions)")
    parser.add_argument("--out", type=Path, default=Path("lab"), help="directory for the plot and the JSON result (default: lab)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    parser.add_argument("--data-dir", type=Path, default=None,
                        help="where the data sets are, for the labs that read one (efficient: Tiny Shakespeare); "
                             "default: $AIAYN_DATA_DIR, then the user cache")


def run(args: argparse.Namespace) -> int:
    from aiayn.lab import LABS, run_lab

    names = list(LABS) if args.name == "all" else [args.name]
    for name in names:
        print(f"running lab {name}{' (quick)' if args.quick else ''}...", flush=True)
        result = run_lab(name, quick=args.quick, out_dir=args.out, seed=args.seed, data_dir=args.data_dir)
        args.out.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(args.out / f"lab_{name}.json", (json.dumps(result.to_dict(), indent=1) + "\n").encode())
        print(result.format())
        print()
    return 0
