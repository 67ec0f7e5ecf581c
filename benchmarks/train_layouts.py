"""Do the bf16 training products' written-out transposes pay in a whole step? Ours with the layouts timed for each
Linear shape (``aiayn.nn.onednn_linear``, as ``aiayn train`` chooses them) against the same model with the transposes
taken back (rows in one call or two kept as chosen), in one process, in interleaved rounds, with the same data.

    python benchmarks/train_layouts.py --shape gpt2 --dtype bf16-master --steps 2 --rounds 7
    python benchmarks/train_layouts.py --quick          # a tiny shape, 2 rounds of 1 step (a smoke test in seconds)

Prints each layer's choice, the first losses of both (equal up to bf16 rounding), and the median milliseconds a step.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from aiayn.allocator import hold_freed_memory, reexec_with_allocator
from aiayn.cpu import cpu_summary
from aiayn.nn.onednn_linear import RowSplitLinear
from aiayn.training.config import LoopSection

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/train_throughput.py, however this script is loaded
from train_throughput import QUICK_SHAPE, SHAPES, Shape, Trainer, build_pair, matmul_kernels, ours_logits, own_loss  # noqa: E402

TRANSPOSES = ("transpose_forward", "transpose_weight_grad")


def main(argv: Sequence[str] | None = None) -> dict[str, float]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default="gpt2")
    p.add_argument("--dtype", choices=("bf16", "bf16-master"), default="bf16-master")
    p.add_argument("--steps", type=int, default=2, help="steps a round (default 2)")
    p.add_argument("--rounds", type=int, default=7, help="interleaved rounds (default 7)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="a tiny shape, 2 rounds of 1 step (a smoke test)")
    args = p.parse_args(argv)
    if args.quick:
        args.steps, args.rounds = 1, 2
    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        return _run(args, QUICK_SHAPE if args.quick else SHAPES[args.shape])
    finally:
        torch.set_num_threads(threads)


def _run(args: argparse.Namespace, shape: Shape) -> dict[str, float]:
    print(f"CPU: {cpu_summary()}; torch {torch.__version__}, {torch.get_num_threads()} threads")
    ours, _ = build_pair(shape, peer_activation="gelu_pytorch_tanh", ours_attention="auto")
    matmul_kernels(ours, shape.batch * shape.seq_len, args.dtype)
    without = copy.deepcopy(ours)
    layouts: dict[str, list[str]] = {}
    for name, layer in without.named_modules():
        if isinstance(layer, RowSplitLinear) and any(getattr(layer, flag) for flag in TRANSPOSES):
            flags = ", ".join(flag for flag in ("split_forward", "split_input_grad", *TRANSPOSES) if getattr(layer, flag))
            layouts.setdefault(flags, []).append(name.removeprefix("decoder."))
            for flag in TRANSPOSES:
                setattr(layer, flag, False)
    for flags, names in layouts.items():
        print(f"{len(names)} layers with a transpose chosen ({flags}): {', '.join(names[:2])}{', ...' if len(names) > 2 else ''}")
    trainers = {"timed layouts": Trainer(ours, ours_logits, args.dtype, "fused", own_loss),
                "without transposes": Trainer(without, ours_logits, args.dtype, "fused", own_loss)}
    data = torch.randint(shape.vocab_size, (shape.batch, shape.seq_len + 1), generator=torch.Generator().manual_seed(0))
    ids, targets = data[:, :-1], data[:, 1:]
    first = {name: [round(t.step(ids, targets), 5) for _ in range(2)] for name, t in trainers.items()}  # and warm-up
    print(f"first losses: {first}")
    start = time.perf_counter()
    trainers["timed layouts"].step(ids, targets)
    hold_freed_memory(LoopSection().hold_freed_steps * (time.perf_counter() - start))  # as `aiayn train` does by default
    times: dict[str, list[float]] = {name: [] for name in trainers}
    for r in range(args.rounds):
        for name in (list(trainers) if r % 2 == 0 else list(reversed(trainers))):
            start = time.perf_counter()
            for _ in range(args.steps):
                trainers[name].step(ids, targets)
            times[name].append((time.perf_counter() - start) / args.steps * 1e3)
    medians = {name: statistics.median(t) for name, t in times.items()}
    for name, t in times.items():
        print(f"{name}: {medians[name]:.1f} ms a step (rounds {', '.join(f'{x:.0f}' for x in t)})")
    print(f"timed layouts / without transposes: {medians['without transposes'] / medians['timed layouts']:.3f}x the speed")
    return medians


if __name__ == "__main__":
    reexec_with_allocator()  # the aiayn command's allocator, as train_throughput.py runs
    main()
