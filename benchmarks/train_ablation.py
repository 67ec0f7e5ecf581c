"""Does one of ``aiayn train``'s CPU training choices pay in a whole step? Ours set up as ``aiayn train`` sets it up
(each Linear shape's timed products, ``aiayn.nn.onednn_linear``; a tied table's gradient as rows,
``aiayn.nn.embedding.use_row_gradients``) against the same model with one choice taken back, in one process, in
interleaved rounds, with the same data:

- ``--take-back transposes``: bf16 products' written-out transposes (the rows in one call or two kept as chosen);
- ``--take-back row-gradients``: the tied embedding's gradient as a whole table again;
- ``--take-back tiles``: bf16 training attention on matrix tiles (``attention_tiles.cpp``), where timed faster, back
  to our kernel in fp32 arithmetic (``attention_train.cpp``) for the other model's steps.

    python benchmarks/train_ablation.py --take-back transposes --shape gpt2 --dtype bf16-master --steps 2 --rounds 7
    python benchmarks/train_ablation.py --take-back row-gradients --shape gpt2 --dtype fp32 --steps 1 --rounds 5
    python benchmarks/train_ablation.py --take-back tiles --shape gpt2 --dtype bf16-master --steps 2 --rounds 7
    python benchmarks/train_ablation.py --quick          # a tiny shape, 2 rounds of 1 step (a smoke test in seconds)

Prints what was taken back, the first losses of both (equal up to rounding), and the median milliseconds a step.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import statistics
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch
from torch import nn

from aiayn.allocator import hold_freed_memory, reexec_with_allocator
from aiayn.cpu import cpu_summary
from aiayn.inference import kernel_choice
from aiayn.nn.embedding import TokenEmbedding, use_row_gradients
from aiayn.nn.onednn_linear import RowSplitLinear
from aiayn.training.config import LoopSection

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/train_throughput.py, however this script is loaded
from train_throughput import QUICK_SHAPE, SHAPES, Shape, Trainer, build_pair, matmul_kernels, ours_logits, own_loss  # noqa: E402

TRANSPOSES = ("transpose_forward", "transpose_weight_grad")


def take_back_transposes(model: nn.Module) -> list[str]:
    """Turn ``model``'s written-out transposes off; what each layer had, grouped, in words."""
    layouts: dict[str, list[str]] = {}
    for name, layer in model.named_modules():
        if isinstance(layer, RowSplitLinear) and any(getattr(layer, flag) for flag in TRANSPOSES):
            flags = ", ".join(flag for flag in ("split_forward", "split_input_grad", *TRANSPOSES) if getattr(layer, flag))
            layouts.setdefault(flags, []).append(name.removeprefix("decoder."))
            for flag in TRANSPOSES:
                setattr(layer, flag, False)
    return [f"{len(names)} layers with a transpose chosen ({flags}): {', '.join(names[:2])}{', ...' if len(names) > 2 else ''}"
            for flags, names in layouts.items()]


def take_back_row_gradients(model: nn.Module) -> list[str]:
    """Turn ``model``'s row gradients off; the tables that had them, in words."""
    tables = [name for name, m in model.named_modules() if isinstance(m, TokenEmbedding) and m.row_gradients]
    for name in tables:
        model.get_submodule(name).row_gradients = False
    return [f"tied tables with row gradients: {', '.join(tables) or 'none'}"]


def take_back_tiles(model: nn.Module) -> list[str]:
    """Nothing in ``model`` changes: the attention kernel is chosen per shape for the process (:func:`without_tiles`)."""
    return ["training attention on matrix tiles taken back to ours in fp32 arithmetic, where it was chosen"]


@contextlib.contextmanager
def without_tiles() -> Iterator[None]:
    """The process's training attention choices with ``native-tiles`` read as ``native`` meanwhile."""
    chosen = dict(kernel_choice._TRAINING_CHOSEN)
    kernel_choice._TRAINING_CHOSEN.update({key: "native" for key, name in chosen.items() if name == "native-tiles"})
    try:
        yield
    finally:
        kernel_choice._TRAINING_CHOSEN.update(chosen)


TAKE_BACK = {"transposes": take_back_transposes, "row-gradients": take_back_row_gradients, "tiles": take_back_tiles}
AROUND = {"tiles": without_tiles}  # what the taken-back model's steps run inside, where the choice is not the model's


def main(argv: Sequence[str] | None = None) -> dict[str, float]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--take-back", choices=sorted(TAKE_BACK), default="transposes")
    p.add_argument("--shape", choices=sorted(SHAPES), default="gpt2")
    p.add_argument("--dtype", choices=("fp32", "bf16", "bf16-master"), default="bf16-master")
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
    print(f"CPU: {cpu_summary()}; torch {torch.__version__}, {torch.get_num_threads()} threads; {shape.name}, {args.dtype}")
    ours, _ = build_pair(shape, peer_activation="gelu_pytorch_tanh", ours_attention="auto")
    matmul_kernels(ours, shape.batch * shape.seq_len, args.dtype)
    use_row_gradients(ours)  # as `aiayn train` does for language models
    without = copy.deepcopy(ours)
    for line in TAKE_BACK[args.take_back](without):
        print(line)
    taken = f"without {args.take_back}"
    trainers = {"as aiayn train": Trainer(ours, ours_logits, args.dtype, "fused", own_loss),
                taken: Trainer(without, ours_logits, args.dtype, "fused", own_loss)}
    around = {"as aiayn train": contextlib.nullcontext, taken: AROUND.get(args.take_back, contextlib.nullcontext)}
    data = torch.randint(shape.vocab_size, (shape.batch, shape.seq_len + 1), generator=torch.Generator().manual_seed(0))
    ids, targets = data[:, :-1], data[:, 1:]
    first = {}
    for name, t in trainers.items():  # and warm-up
        with around[name]():
            first[name] = [round(t.step(ids, targets), 5) for _ in range(2)]
    print(f"first losses: {first}")
    start = time.perf_counter()
    trainers["as aiayn train"].step(ids, targets)
    hold_freed_memory(LoopSection().hold_freed_steps * (time.perf_counter() - start))  # as `aiayn train` does by default
    times: dict[str, list[float]] = {name: [] for name in trainers}
    for r in range(args.rounds):
        for name in (list(trainers) if r % 2 == 0 else list(reversed(trainers))):
            with around[name]():
                start = time.perf_counter()
                for _ in range(args.steps):
                    trainers[name].step(ids, targets)
            times[name].append((time.perf_counter() - start) / args.steps * 1e3)
    medians = {name: statistics.median(t) for name, t in times.items()}
    for name, t in times.items():
        print(f"{name}: {medians[name]:.1f} ms a step (rounds {', '.join(f'{x:.0f}' for x in t)})")
    print(f"as aiayn train / {taken}: {medians[taken] / medians['as aiayn train']:.3f}x the speed")
    return medians


if __name__ == "__main__":
    reexec_with_allocator()  # the aiayn command's allocator, as train_throughput.py runs
    main()
