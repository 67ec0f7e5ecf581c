"""How close does training stay to the memory its tensors need? For each CPU recipe, the peak resident set
size (``ru_maxrss``) of a short training run beside its tensor high-water mark, in one run of this script.

The high-water mark is what the tensors need at the worst moment of a step: the parameters, their
gradients, the optimizer state (read from the run's last checkpoint, exactly what Adam holds) and the
activations the largest training batch keeps for the backward pass (the tensors autograd saves,
counted once per storage, parameters excluded, measured with ``torch.autograd.graph.saved_tensors_hooks``
on the few largest batches of the first epoch). Peak RSS also holds the interpreter, torch's libraries,
the data set, the tokenizer and whatever the allocator keeps of freed blocks: ``peak / HWM`` is the
overhead. Each recipe trains in a fresh process (the environment passes through, so allocator
settings such as ``MALLOC_ARENA_MAX`` apply to it), for ``--steps`` steps, checkpointing and
validating once at the end, once under each allocator of ``--allocators`` (the system's malloc, and
mimalloc, which the ``aiayn`` command preloads where it is installed: :mod:`aiayn.allocator`), one after the
other, each row with the median tokens/s of its steps and its last loss (an allocator must change no bit).

    python benchmarks/train_memory.py                                   # every CPU recipe, 60 steps each
    python benchmarks/train_memory.py --recipes multi30k-de-en --steps 60
    MALLOC_ARENA_MAX=2 python benchmarks/train_memory.py --recipes multi30k-de-en
    python benchmarks/train_memory.py --config my.yaml --steps 2 --set data.pad_to_multiple=8
    python benchmarks/train_memory.py --recipes multi30k-de-en --steps 150 --allocators system,mimalloc
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from aiayn.cpu import cpu_summary

RESULT = "TRAIN_MEMORY_RESULT "  # the child's one line of JSON
# Recipes that need a GPU or another run's weights (init_from) are left out of the default list.
SKIPPED = {"shakespeare-char-gpu": "a GPU recipe", "sst2": "starts from runs/sst2-mlm (init_from)",
           "sst2-minilm": "starts from a pretrained package (init_from)"}
CANDIDATES = 3  # largest batches measured, by token count and by attention size each


def cpu_recipes() -> list[str]:
    from aiayn.recipes import recipe_names

    return [name for name in recipe_names() if name not in SKIPPED]


def load_config(config: str, steps: int, overrides: Sequence[str], run_dir: str) -> Any:
    """The recipe (or YAML file) ``config`` shortened to ``steps`` steps, saved and validated once, at the end."""
    from aiayn.config_io import apply_overrides, load_yaml
    from aiayn.recipes import resolve_config_path
    from aiayn.training.config import TrainConfig

    short = [f"run_dir={run_dir}", f"train.max_steps={steps}", f"train.save_every={steps}", f"train.eval_every={steps}",
             "train.stop_after=null", "train.max_minutes=null", "train.eval_bleu=0", "train.progress=false",
             "train.tensorboard=false", "train.log_every=1"]
    return apply_overrides(load_yaml(resolve_config_path(config), TrainConfig), [*short, *overrides])


def measure(config: Any) -> dict[str, Any]:
    """Train ``config`` in this process; return its peak RSS and the parts of its tensor high-water mark (bytes)."""
    from aiayn.checkpoint.weights import read_safetensors
    from aiayn.training.loop import train
    from aiayn.training.master_weights import MasterWeights
    from aiayn.training.metrics_log import peak_rss_bytes, read_metrics
    from aiayn.training.precision import MASTER

    result = train(config, resume=False)
    peak = peak_rss_bytes()  # before the measurement below adds its own
    params = list(result.model.parameters())  # a tied parameter once
    param_bytes = sum(p.numel() * p.element_size() for p in params)
    grad_bytes = sum(p.numel() * p.element_size() for p in params if p.requires_grad)
    precision = _precision(result.model, config)
    master = MasterWeights(result.model) if precision == MASTER else None
    if master is not None:  # the bf16 copies are parameters too; their gradients are added into the masters'
        param_bytes += sum(c.numel() * c.element_size() for c in master.copies.values())
    assert result.last_checkpoint is not None  # save_every = max_steps
    optimizer_tensors, _ = read_safetensors(result.last_checkpoint / "optimizer.safetensors")
    optimizer_bytes = sum(t.numel() * t.element_size() for t in optimizer_tensors.values())
    activation_bytes, shape = largest_activations(result, config, precision, master)
    records = [r for r in read_metrics(result.run_dir) if "tokens_per_s" in r]
    return {
        "tokens_per_s": statistics.median(r["tokens_per_s"] for r in records) if records else None,
        "loss": records[-1]["loss"] if records else None,
        "precision": precision, "peak_rss": peak, "params": param_bytes, "grads": grad_bytes, "optimizer": optimizer_bytes,
        "activations": activation_bytes, "largest_batch": shape, "steps": result.step,
        "hwm": param_bytes + grad_bytes + optimizer_bytes + activation_bytes,
    }


def _precision(model: Any, config: Any) -> str:
    """The precision the loop resolved for this run (one process)."""
    from aiayn.training.precision import resolve_precision

    device = next(model.parameters()).device
    n_params = sum(p.numel() for p in model.parameters())
    return resolve_precision(config.train.precision, device, n_params=n_params, master_ok=not config.train.compile)


def largest_activations(result: Any, config: Any, precision: str, master: Any = None) -> tuple[int, str]:
    """The most bytes autograd saves for one training batch of the first epoch, and that batch's shape."""
    import numpy as np

    loader = result.data.train
    batches = loader.epoch_batches(0)[:2000]
    collated = [loader.collate([loader.dataset[i] for i in b], np.random.default_rng(0)) for b in batches]
    widths = [_widths(batch) for batch in collated]
    by_tokens = sorted(range(len(collated)), key=lambda k: -sum(b * t for b, t in widths[k]))[:CANDIDATES]
    by_square = sorted(range(len(collated)), key=lambda k: -sum(b * t * t for b, t in widths[k]))[:CANDIDATES]
    best, shape = 0, ""
    for k in dict.fromkeys(by_tokens + by_square):
        saved = saved_bytes(result.model, result.data.task, collated[k], config, precision, master)
        if saved > best:
            best, shape = saved, " + ".join(f"{b}x{t}" for b, t in widths[k])
    return best, shape


def _widths(batch: Any) -> list[tuple[int, int]]:
    """(rows, length) of each sequence side of a batch: source and target, or the one input."""
    sides = [getattr(batch, name) for name in ("src", "tgt_in", "input") if hasattr(batch, name)]
    return [(int(t.shape[0]), int(t.shape[1])) for t in sides]


def saved_bytes(model: Any, task: str, batch: Any, config: Any, precision: str, master: Any = None) -> int:
    """Bytes of the distinct storages autograd keeps for ``batch``'s backward (not the parameters' or
    their bf16 copies'), at the run's ``precision``, through the same objective the loop trains."""

    import torch

    from aiayn.training.objectives import Objective
    from aiayn.training.precision import autocast_context

    device = next(model.parameters()).device
    weights = list(model.parameters()) + (master.working_tensors() if master else [])
    own = {p.untyped_storage().data_ptr() for p in weights}
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in own:
            storages[storage.data_ptr()] = storage.nbytes()
        return t

    objective = Objective(model, task, label_smoothing=config.train.label_smoothing).train()
    context = master.swapped() if master is not None else autocast_context(precision, device)()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), context:
        loss = objective(batch.to(device))
    del loss
    return sum(storages.values())


# --------------------------------------------------------------------------- the parent: one process per recipe


def child_env(allocator: str) -> dict[str, str]:
    """The environment of a training process under ``allocator`` (``system`` or ``mimalloc``), as the ``aiayn``
    command would set it (:func:`aiayn.allocator.preload_env`); a ``RuntimeError`` where mimalloc cannot be had."""
    from aiayn.allocator import ENV_VAR, preload_env

    env = {**os.environ, ENV_VAR: allocator}
    return preload_env(env) or env


def run_child(config: str, steps: int, overrides: Sequence[str], allocator: str = "system") -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="train-memory-") as tmp:
        cmd = [sys.executable, __file__, "--child", config, "--steps", str(steps), "--run-dir", str(Path(tmp) / "run")]
        for item in overrides:
            cmd += ["--set", item]
        out = subprocess.run(cmd, capture_output=True, text=True, env=child_env(allocator))
    lines = [line for line in out.stdout.splitlines() if line.startswith(RESULT)]
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"{config}: the training process failed (exit {out.returncode}):\n{out.stderr[-3000:]}")
    return json.loads(lines[-1][len(RESULT):])


def format_table(rows: Sequence[tuple[str, dict[str, Any]]]) -> str:
    mb = 2**20
    lines = [
        "| recipe | allocator | precision | steps | tokens/s | last loss | peak RSS MB | tensor HWM MB | peak / HWM | params MB | grads MB "
        "| optimizer MB | activations MB | largest batch |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for name, r in rows:
        rate = f"{r['tokens_per_s']:,.0f}" if r.get("tokens_per_s") else "-"
        loss = f"{r['loss']:.6f}" if r.get("loss") is not None else "-"
        lines.append(
            f"| {name} | {r.get('allocator', '-')} | {r['precision']} | {r['steps']} | {rate} | {loss} | {r['peak_rss'] / mb:,.0f} | "
            f"{r['hwm'] / mb:,.0f} | {r['peak_rss'] / r['hwm']:.2f} | "
            f"{r['params'] / mb:,.1f} | {r['grads'] / mb:,.1f} | {r['optimizer'] / mb:,.1f} | {r['activations'] / mb:,.1f} | "
            f"{r['largest_batch']} |"
        )
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--recipes", default=None, help="comma-separated recipe names (default: every CPU recipe)")
    p.add_argument("--config", default=None, help="a training YAML file instead of recipes")
    p.add_argument("--steps", type=int, default=60, help="training steps per recipe (default: 60)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="a config override for every run, as aiayn train --set (repeatable)")
    p.add_argument("--allocators", default="system,mimalloc",
                   help="comma-separated, from system, mimalloc: each recipe trains once under each (default: both)")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)  # one recipe, in this process
    p.add_argument("--run-dir", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.steps < 1:
        p.error(f"--steps must be >= 1, got {args.steps}")
    args.allocators = [a for a in args.allocators.split(",") if a]
    if not args.allocators or any(a not in ("system", "mimalloc") for a in args.allocators):
        p.error(f"--allocators: comma-separated from system, mimalloc, got {','.join(args.allocators)!r}")
    if args.recipes and args.config:
        p.error("give --recipes or --config, not both")
    if args.recipes:
        from aiayn.recipes import recipe_names

        for name in args.recipes.split(","):
            if name not in recipe_names():
                p.error(f"--recipes: unknown {name!r}; choose from {', '.join(recipe_names())}")
    return args


def main(argv: Sequence[str] | None = None) -> list[tuple[str, dict[str, Any]]]:
    args = parse_args(argv)
    if args.child is not None:
        result = measure(load_config(args.child, args.steps, args.overrides, args.run_dir))
        print(RESULT + json.dumps(result), flush=True)
        return [(args.child, result)]
    names = [args.config] if args.config else (args.recipes.split(",") if args.recipes else cpu_recipes())
    settings = {k: v for k, v in os.environ.items() if k.startswith(("MALLOC_", "MIMALLOC_", "LD_PRELOAD"))}
    print(f"CPU: {cpu_summary()}; python {platform.python_version()}; "
          f"allocator settings: {settings or 'none (the defaults)'}; overrides: {args.overrides or 'none'}")
    if not args.config and not args.recipes:
        print("left out: " + "; ".join(f"{k} ({v})" for k, v in SKIPPED.items()))
    rows = []
    for name in names:
        for allocator in args.allocators:
            r = {**run_child(name, args.steps, args.overrides, allocator), "allocator": allocator}
            rows.append((name, r))
            print(f"  {name}, {allocator}: peak RSS {r['peak_rss'] / 2**20:,.0f} MB, tensor HWM {r['hwm'] / 2**20:,.0f} MB "
                  f"({r['peak_rss'] / r['hwm']:.2f}x)", flush=True)
    print(format_table(rows))
    return rows


if __name__ == "__main__":
    main()
