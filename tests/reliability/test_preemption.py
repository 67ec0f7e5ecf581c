"""Save on preemption: SIGINT/SIGTERM during `aiayn train` finishes the step, saves, and exits 130/143;
the resume matches an uninterrupted run bit for bit; a second signal exits at once."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from loop_fixtures import lm_config, save_config
from training_helpers import assert_same

from aiayn.checkpoint.state import list_checkpoints, load_checkpoint
from aiayn.training.distributed import DistInfo
from aiayn.training.loop import train
from aiayn.training.metrics_log import read_metrics
from aiayn.training.preemption import Preemption

pytestmark = pytest.mark.reliability
ROOT = Path(__file__).resolve().parents[2]
FOREVER = 1_000_000  # max_steps: the run only ends by a signal (a constant schedule: max_steps changes nothing)


def _config(tmp: Path, **loop: object):
    config = lm_config(tmp, steps=FOREVER, save_every=FOREVER, eval_every=FOREVER)
    return dataclasses.replace(config, train=dataclasses.replace(config.train, **loop))


def _start(config_path: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-c", "import torch, sys; torch.set_num_threads(1); from aiayn.cli.main import main; "
                             "sys.exit(main(['train', sys.argv[1]]))", str(config_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)


def _wait_for_step(process: subprocess.Popen[str], run_dir: Path, step: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"training ended early: {process.communicate()[1]}")
        metrics = run_dir / "metrics.jsonl"
        if metrics.exists() and any(r.get("step", 0) >= step for r in read_metrics(run_dir)):
            return
        time.sleep(0.02)
    process.kill()
    raise AssertionError(f"step {step} not reached in {timeout} s")


def _losses(run_dir: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(run_dir) if "loss" in r}


def test_sigint_saves_the_step_exits_130_and_the_resume_is_bit_exact(tmp_path):
    config = _config(tmp_path / "b")
    run_dir = Path(config.run_dir)
    process = _start(save_config(config, tmp_path / "b.yaml"))
    _wait_for_step(process, run_dir, 3)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 130, err
    assert "Traceback" not in err
    saved = list_checkpoints(run_dir)
    assert len(saved) == 1, err
    stopped = load_checkpoint(saved[0]).step
    assert f"interrupted by SIGINT at step {stopped}: saved {saved[0]}" in err

    end = stopped + 3
    resumed = train(dataclasses.replace(config, train=dataclasses.replace(config.train, stop_after=end)))  # auto-resume
    straight = train(_config(tmp_path / "a", stop_after=end))
    assert resumed.step == straight.step == end
    assert _losses(run_dir) == _losses(Path(straight.run_dir)) and sorted(_losses(run_dir)) == list(range(1, end + 1))
    a, b = load_checkpoint(straight.last_checkpoint), load_checkpoint(resumed.last_checkpoint)
    assert_same(a.model_state, b.model_state, "weights")
    assert_same(a.optimizer_state, b.optimizer_state, "optimizer")
    for name, tensor in a.model_state.items():
        assert torch.equal(tensor, b.model_state[name]), name


def test_a_second_signal_exits_at_once(monkeypatch):
    """In this process (a second signal sent to a child can coalesce with the first): the first SIGTERM
    only sets the flag; the second calls os._exit(143) at once, from the handler."""
    exits: list[int] = []
    monkeypatch.setattr(os, "_exit", exits.append)
    with Preemption(DistInfo(), torch.device("cpu")) as preemption:
        os.kill(os.getpid(), signal.SIGTERM)
        assert preemption.requested() == signal.SIGTERM and exits == []
        os.kill(os.getpid(), signal.SIGTERM)
        assert exits == [143]
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # restored after training


@pytest.mark.slow
def test_sigterm_under_torchrun_saves_every_ranks_state(tmp_path):
    """torchrun forwards SIGTERM to the gloo ranks: they agree on the step, and rank 0 saves with rank 1's
    generators and loader position."""
    config = _config(tmp_path)
    run_dir = Path(config.run_dir)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                                "-m", "aiayn", "train", str(save_config(config, tmp_path / "c.yaml"))],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    _wait_for_step(process, run_dir, 2, timeout=120)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=120)
    saved = list_checkpoints(run_dir)
    assert len(saved) == 1, err[-3000:]
    checkpoint = load_checkpoint(saved[0])
    assert set(checkpoint.ranks) == {1} and checkpoint.ranks[1].data is not None
    assert f"interrupted by SIGTERM at step {checkpoint.step}: saved {saved[0]}" in err
    # At least one rank saw it; the other may learn it from the step's all-reduce and exit before torchrun's forwarded
    # SIGTERM reaches it (seen once in CI on a loaded 2-core machine), and the checkpoint above holds its state anyway.
    assert 1 <= err.count("SIGTERM: finishing this step, then saving a checkpoint") <= 2
    # torchrun itself ends with its agent's SignalException (torch's own traceback, after the workers saved)
