"""The tutorials' claims about the Transformer as small experiments, each printing a verdict with its numbers.

Each experiment is a module with ``run(*, quick, out_dir, seed) -> LabResult``; ``quick`` shrinks it to
seconds for tests. Default sizes take at most a few minutes on a 2-core CPU.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from aiayn.lab.common import LabResult

__all__ = ["LABS", "run_lab", "LabResult"]

# name -> one line on what it checks; the module aiayn.lab.<name> holds it
LABS: dict[str, str] = {
    "scaling": "scaling scores by 1/sqrt(d_k) keeps the softmax unsaturated and its gradient alive",
    "prenorm": "Pre-LN trains a deep stack without warmup; Post-LN needs warmup",
    "positions": "sinusoidal vs learned positions beyond the training length",
    "heads": "h heads of size d/h cost about as much as one head of size d",
    "smoothing": "label smoothing hurts perplexity but helps accuracy/BLEU",
    "efficient": "local/linear attention and a selective SSM: quality at one budget, and associative recall",
}


def run_lab(
    name: str, *, quick: bool = False, out_dir: str | Path = "lab", seed: int = 0, data_dir: str | Path | None = None
) -> LabResult:
    """Run the experiment ``name``; raises ``ValueError`` for an unknown name. ``data_dir``: where the data sets
    are, for the labs that read one (default: ``$AIAYN_DATA_DIR``, then the user cache)."""
    if name not in LABS:
        raise ValueError(f"unknown lab {name!r}; valid labs: {', '.join(LABS)}")
    module = importlib.import_module(f"aiayn.lab.{name}")
    result: LabResult = module.run(quick=quick, out_dir=Path(out_dir), seed=seed, data_dir=Path(data_dir) if data_dir else None)
    result.quick = quick
    return result
