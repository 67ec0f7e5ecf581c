"""``aiayn copy-task``: train a tiny encoder-decoder to copy random sequences, then show it working."""

from __future__ import annotations

import argparse
import sys

import torch

from aiayn.decoding.greedy import greedy
from aiayn.tasks.copy import PASS_THRESHOLD, copy_batch, train_copy_task
from aiayn.tokenization.special import EOS_ID


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int, default=1000, help="training steps (default: 1000)")
    parser.add_argument("--length", type=int, default=10, help="sequence length (default: 10)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")


def run(args: argparse.Namespace) -> int:
    for name in ("steps", "length"):
        if getattr(args, name) < 1:
            raise SystemExit(f"aiayn copy-task: --{name} must be >= 1, got {getattr(args, name)}")
    print(f"training a 2-layer encoder-decoder to copy sequences of {args.length} symbols ({args.steps} steps)...")
    result = train_copy_task(steps=args.steps, length=args.length, seed=args.seed)
    print(f"trained in {result.seconds:.1f} s; final loss {result.final_loss:.4f}")
    print(f"exact match with greedy decoding on 256 new sequences: {100 * result.exact_match:.1f}%")
    src, _, _ = copy_batch(3, args.length, result.model.config.vocab_size, torch.Generator().manual_seed(args.seed + 2))
    out = greedy(result.model.eval(), src, max_new_tokens=args.length + 1).tokens
    print(f"three examples (output ends with EOS = {EOS_ID}):")
    for row_in, row_out in zip(src.tolist(), out.tolist()):
        print(f"  {row_in} -> {row_out}")
    if result.exact_match < PASS_THRESHOLD:
        print(f"FAILED: exact match {100 * result.exact_match:.1f}% is below the pass mark of {100 * PASS_THRESHOLD:.0f}% "
              f"(try more --steps, or another --seed)", file=sys.stderr)
        return 1
    print(f"passed: exact match >= {100 * PASS_THRESHOLD:.0f}%")
    return 0
