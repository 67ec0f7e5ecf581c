"""Where training numbers go: one JSON line per record (``metrics.jsonl``) and, if installed, TensorBoard;
and the process's peak resident memory, which every training record carries (``peak_rss_mb``)."""

from __future__ import annotations

import json
import logging
import math
import sys
from pathlib import Path
from typing import Any

from aiayn.checkpoint.atomic_io import atomic_write_bytes

try:
    import resource
except ImportError:  # Windows
    resource = None  # type: ignore[assignment]

__all__ = ["MetricsLog", "METRICS_FILE", "read_metrics", "peak_rss_bytes"]

METRICS_FILE = "metrics.jsonl"
log = logging.getLogger(__name__)


class MetricsLog:
    """Append records to ``run_dir/metrics.jsonl`` (and TensorBoard events under ``run_dir/tensorboard``)."""

    def __init__(self, run_dir: Path, *, tensorboard: bool, resume_step: int | None = None) -> None:
        self.path = run_dir / METRICS_FILE
        if resume_step is not None and self.path.exists():
            # Records logged after the checkpoint we resume from would be repeated: drop them.
            kept = [r for r in read_metrics(self.path) if r.get("step", 0) <= resume_step]
            atomic_write_bytes(self.path, "".join(json.dumps(r) + "\n" for r in kept).encode())
        self.file = open(self.path, "a", encoding="utf-8")
        self.writer = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                log.info("TensorBoard is not installed (pip install tensorboard); metrics go to %s only", self.path)
            else:
                self.writer = SummaryWriter(str(run_dir / "tensorboard"), purge_step=resume_step)

    def write(self, step: int, values: dict[str, Any]) -> None:
        record = {"step": step, **values}
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()
        if self.writer is not None:
            for key, value in values.items():
                if isinstance(value, (int, float)) and math.isfinite(value):
                    self.writer.add_scalar(key, value, step)

    def close(self) -> None:
        self.file.close()
        if self.writer is not None:
            self.writer.close()


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """All records of a ``metrics.jsonl`` file (or of ``RUN_DIR/metrics.jsonl``)."""
    path = Path(path)
    if path.is_dir():
        path = path / METRICS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no metrics at {path}: is it a training run directory?")
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def peak_rss_bytes() -> int:
    """The most resident memory this process has held so far (``getrusage``'s ``ru_maxrss``: KiB on Linux, bytes on macOS)."""
    if resource is None:  # Windows has no getrusage
        return 0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)
