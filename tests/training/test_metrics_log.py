"""metrics.jsonl and TensorBoard events: both hold what was written, and a resume drops what came after."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from aiayn.training.metrics_log import MetricsLog, peak_rss_bytes, read_metrics


def test_jsonl_records_and_resume_truncation(tmp_path):
    log = MetricsLog(tmp_path, tensorboard=False)
    for step in (10, 20, 30):
        log.write(step, {"loss": 1.0 / step})
    log.close()
    assert [r["step"] for r in read_metrics(tmp_path)] == [10, 20, 30]
    resumed = MetricsLog(tmp_path, tensorboard=False, resume_step=20)  # step 30 will be logged again
    resumed.write(30, {"loss": 0.5})
    resumed.close()
    assert read_metrics(tmp_path) == [{"step": 10, "loss": 0.1}, {"step": 20, "loss": 0.05}, {"step": 30, "loss": 0.5}]


def test_tensorboard_events_hold_the_finite_scalars(tmp_path):
    pytest.importorskip("tensorboard", reason="TensorBoard is an optional dependency (pip install tensorboard)")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    log = MetricsLog(tmp_path, tensorboard=True)
    log.write(1, {"loss": 2.5, "lr": 1e-3, "note": "text is skipped"})
    log.write(2, {"loss": math.nan, "lr": 2e-3})  # non-finite values stay out of TensorBoard
    log.close()
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert sorted(events.Tags()["scalars"]) == ["loss", "lr"]
    assert [(e.step, e.value) for e in events.Scalars("loss")] == [(1, 2.5)]
    assert [(e.step, pytest.approx(e.value)) for e in events.Scalars("lr")] == [(1, 1e-3), (2, 2e-3)]


def test_missing_metrics_say_what_was_expected(tmp_path):
    with pytest.raises(FileNotFoundError, match="is it a training run directory"):
        read_metrics(tmp_path)


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="reads the resident size from /proc (Linux)")
def test_peak_rss_is_getrusages_peak_in_bytes_and_at_least_the_resident_size_now():
    import resource

    rss_now = int(Path("/proc/self/statm").read_text().split()[1]) * resource.getpagesize()
    peak = peak_rss_bytes()
    assert peak >= rss_now - 16 * 2**20 > 0  # the resident size may have grown a little between the two reads
    assert abs(peak - resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024) <= 16 * 2**20  # KiB on Linux
