"""``aiayn bench attention``: time and memory of attention, an LSTM and a convolution against sequence length."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiayn.checkpoint.atomic_io import atomic_write_bytes
from aiayn.viz.complexity import default_lengths


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="bench_command", metavar="WHAT", required=True)
    att = sub.add_parser(
        "attention", help="time and peak memory against sequence length, with fitted log-log slopes",
        description="Forward time and peak memory of math and sdpa attention, an LSTM and a convolution of "
        "the same width, for lengths min-len, 2 min-len, ... max-len; log-log slopes checked against the "
        "complexity table (attention O(n^2 d), recurrent O(n d^2), convolution O(k n d^2)).",
    )
    att.add_argument("--max-len", type=int, default=16384, help="longest sequence (default: 16384; skipped where memory is short)")
    att.add_argument("--min-len", type=int, default=256, help="shortest sequence (default: 256)")
    att.add_argument("--d-model", type=int, default=64, help="width d of every layer (default: 64)")
    att.add_argument("--heads", type=int, default=None, help="attention heads (default: 1; 8 with --efficient)")
    att.add_argument("--batch", type=int, default=1, help="batch size (default: 1)")
    att.add_argument("--repeats", type=int, default=3, help="timed runs per point, best kept (default: 3)")
    att.add_argument("--threads", type=int, default=1, help="torch CPU threads (default: 1, steadier on a shared machine)")
    att.add_argument("--no-memory", action="store_true", help="skip the profiled peak memory (faster)")
    att.add_argument("--quick", action="store_true", help="a tiny run for tests: lengths 16..64, d=16, one repeat")
    att.add_argument("--out", type=Path, default=Path("bench"), help="output directory (default: bench)")
    att.add_argument("--efficient", action="store_true",
                     help="softmax (math, sdpa) against local and linear attention: forward+backward time and memory, "
                     "crossover lengths, time per generated token (writes bench_efficient.png/.json)")
    att.add_argument("--window", type=int, default=256, help="--efficient: local attention's window (default: 256)")
    att.add_argument("--head-dim", type=int, default=64, help="--efficient: size of each head (default: 64)")
    att.add_argument("--gen-tokens", type=int, default=16, help="--efficient: generated tokens timed per context (default: 16)")


def run(args: argparse.Namespace) -> int:
    from aiayn.viz.complexity import bench_attention, format_bench, plot_bench

    if args.threads < 1:
        raise SystemExit(f"aiayn bench attention: --threads must be >= 1, got {args.threads}")
    if args.efficient:
        return _run_efficient(args)
    args.heads = 1 if args.heads is None else args.heads
    if args.quick:
        lengths, d_model, repeats = [16, 32, 64], 16, 1
    else:
        try:
            lengths = default_lengths(args.max_len, args.min_len)
        except ValueError as e:
            raise SystemExit(f"aiayn bench attention: {e}") from None
        d_model, repeats = args.d_model, args.repeats
    print(f"timing {len(lengths)} lengths ({lengths[0]}..{lengths[-1]}) x 4 layers...", flush=True)
    try:
        result = bench_attention(
            lengths, d_model=d_model, n_heads=args.heads, batch=args.batch, repeats=repeats, measure_memory=not args.no_memory,
            threads=args.threads,
        )
    except ValueError as e:
        raise SystemExit(f"aiayn bench attention: {e}") from None
    print(format_bench(result))
    return _write(result, plot_bench, args.out / "bench_attention")


def _run_efficient(args: argparse.Namespace) -> int:
    from aiayn.viz.efficient_bench import bench_efficient, format_efficient, plot_efficient

    heads = 8 if args.heads is None else args.heads
    if args.quick:
        lengths, head_dim, window, repeats, gen_tokens = [32, 64, 128], 8, 16, 1, 3
    else:
        try:
            lengths = default_lengths(args.max_len, args.min_len)
        except ValueError as e:
            raise SystemExit(f"aiayn bench attention: {e}") from None
        head_dim, window, repeats, gen_tokens = args.head_dim, args.window, args.repeats, args.gen_tokens
    print(f"timing {len(lengths)} lengths ({lengths[0]}..{lengths[-1]}): math, sdpa, local (window {window}), linear...", flush=True)
    try:
        result = bench_efficient(
            lengths, heads=heads, head_dim=head_dim, window=window, batch=args.batch, repeats=repeats,
            gen_tokens=gen_tokens, threads=args.threads, measure_memory=not args.no_memory, log=lambda line: print(line, flush=True),
        )
    except ValueError as e:
        raise SystemExit(f"aiayn bench attention: {e}") from None
    print(format_efficient(result))
    return _write(result, plot_efficient, args.out / "bench_efficient")


def _write(result: Any, plot: Callable[[Any, Path], Path], stem: Path) -> int:
    """Draw ``stem.png`` and write ``stem.json`` (the result's numbers), then say where."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    png = plot(result, stem.with_suffix(".png"))
    data = stem.with_suffix(".json")
    atomic_write_bytes(data, (json.dumps(result.to_dict(), indent=1) + "\n").encode())
    print(f"wrote {png} and {data}")
    return 0
