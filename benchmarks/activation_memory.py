"""How much peak memory does activation checkpointing save? One training step (forward, loss, backward)
of our decoder-only model at the GPT-2-small shape, with and without ``apply_activation_checkpointing``.

Each measurement runs in a fresh process: build the model, allocate its gradients, read the resident
set size, run one step, read the peak resident set size (``ru_maxrss``). The difference is the step's
peak working memory (activations kept for backward, plus the transient buffers of the backward
pass). Rounds alternate the two settings; the median per setting is reported, with the step time.

    python benchmarks/activation_memory.py                      # GPT-2 small, batch 4 x 256, fp32, 2 rounds
    python benchmarks/activation_memory.py --quick              # a tiny shape (smoke test)
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

GPT2 = dict(n_layers=12, n_heads=12, d_model=768, vocab_size=50257, batch=4, seq_len=256)
QUICK = dict(n_layers=2, n_heads=2, d_model=32, vocab_size=65, batch=2, seq_len=16)


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * resource.getpagesize()


def measure(shape: dict[str, int], checkpointed: bool, dtype: str) -> dict[str, float]:
    """One step in this process: the resident memory before and at the peak, and the step time."""
    import torch
    import torch.nn.functional as F

    from aiayn import build_model
    from aiayn.training.activation_checkpointing import apply_activation_checkpointing

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = build_model(
        "gpt2-small", n_layers=shape["n_layers"], n_heads=shape["n_heads"], d_model=shape["d_model"],
        d_ff=4 * shape["d_model"], vocab_size=shape["vocab_size"], dropout=0.0,
    ).train()
    if checkpointed:
        apply_activation_checkpointing(model)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    data = torch.randint(shape["vocab_size"], (shape["batch"], shape["seq_len"] + 1))
    before = _rss_bytes()
    start = time.perf_counter()
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bf16")
    with autocast:
        logits = model(data[:, :-1])
    F.cross_entropy(logits.float().flatten(0, 1), data[:, 1:].flatten()).backward()
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    return {"before_mib": before / 2**20, "peak_mib": peak / 2**20, "step_mib": (peak - before) / 2**20, "seconds": seconds}


def main(argv: list[str] | None = None) -> dict[str, list[dict[str, float]]]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--child", choices=("plain", "checkpointed"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    shape = QUICK if args.quick else GPT2
    if args.child:
        print(json.dumps(measure(shape, args.child == "checkpointed", args.dtype)))
        return {}
    results: dict[str, list[dict[str, float]]] = {"plain": [], "checkpointed": []}
    root = Path(__file__).resolve().parents[1]
    for r in range(args.rounds):
        for setting in (("plain", "checkpointed") if r % 2 == 0 else ("checkpointed", "plain")):
            cmd = [sys.executable, __file__, "--child", setting, "--dtype", args.dtype] + (["--quick"] if args.quick else [])
            out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=root)
            results[setting].append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(setting, results[setting][-1], flush=True)
    med = {k: statistics.median(x["step_mib"] for x in v) for k, v in results.items()}
    sec = {k: statistics.median(x["seconds"] for x in v) for k, v in results.items()}
    print(f"shape {shape}, {args.dtype}: step peak memory plain {med['plain']:.0f} MiB, checkpointed "
          f"{med['checkpointed']:.0f} MiB (saved {med['plain'] - med['checkpointed']:.0f} MiB, "
          f"{100 * (1 - med['checkpointed'] / med['plain']):.0f}%); step time {sec['plain']:.2f} s vs {sec['checkpointed']:.2f} s")
    return results


if __name__ == "__main__":
    main()
