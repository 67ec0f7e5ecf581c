"""The training loop: it learns, resumes bit for bit, handles faults per policy, and refuses bad resumes."""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from loop_fixtures import lm_config, save_config, translation_config

from aiayn.checkpoint.state import list_checkpoints, load_checkpoint
from aiayn.checkpoint.weights import read_safetensors
from aiayn.training.loop import _check_same_model, train
from aiayn.training.metrics_log import read_metrics
from aiayn.training.objectives import Objective

ROOT = Path(__file__).resolve().parents[2]


def replace_loop(config, **changes):
    return dataclasses.replace(config, train=dataclasses.replace(config.train, **changes))


def step_losses(run_dir: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(run_dir) if "loss" in r}


def run_cli(*args: str, env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(env_extra or {})}
    return subprocess.run([sys.executable, "-m", "aiayn", *args], capture_output=True, text=True, env=env, cwd=ROOT)


def test_language_model_learns(tmp_path):
    result = train(lm_config(tmp_path, steps=30, eval_every=10))
    records = read_metrics(result.run_dir)
    val = [r["val_loss"] for r in records if "val_loss" in r]
    assert len(val) == 3 and val[-1] < val[0] - 0.3  # it learns the toy text
    assert result.last_checkpoint is not None and result.last_checkpoint.name == "step-000030"
    assert (result.run_dir / "train_config.yaml").is_file()


@pytest.mark.reliability
def test_exact_resume_in_a_fresh_process(tmp_path, caplog):
    """N steps straight == N/2 steps, then a fresh process resuming to N: same losses, same weights, bit for bit.

    Dropout on, shuffling on, and the stop falls mid-epoch (an epoch of this corpus is ~12 batches). The straight
    run and the first half run here (one thread, as in the fresh process); only the resume starts a process.
    fp32, so the Linear layers run on oneDNN (conftest's ``AIAYN_LINEAR_KERNEL=packed``), as on a CPU where it won.
    """
    config = translation_config(tmp_path / "a", steps=8)
    with caplog.at_level(logging.INFO, logger="aiayn.nn.onednn_linear"):
        train(config)
    assert re.search(r"oneDNN for [1-9]\d* of \d+ Linear layers", caplog.text), caplog.text
    config_b = dataclasses.replace(translation_config(tmp_path / "b", steps=8), run_dir=str(tmp_path / "b" / "run"))
    path_b = save_config(config_b, tmp_path / "b.yaml")
    train(replace_loop(config_b, stop_after=4))
    assert [p.name for p in list_checkpoints(tmp_path / "b" / "run")][-1] == "step-000004"
    second = run_cli("train", str(path_b), env_extra={"OMP_NUM_THREADS": "1"})  # a new process, auto-resume
    assert second.returncode == 0, second.stderr
    assert "resumed from" in second.stderr + second.stdout

    losses_a, losses_b = step_losses(tmp_path / "a" / "run"), step_losses(tmp_path / "b" / "run")
    assert sorted(losses_a) == list(range(1, 9)) and losses_a == losses_b
    weights_a, _ = read_safetensors(tmp_path / "a" / "run" / "step-000008" / "model.safetensors")
    weights_b, _ = read_safetensors(tmp_path / "b" / "run" / "step-000008" / "model.safetensors")
    assert weights_a.keys() == weights_b.keys()
    for name in weights_a:
        assert torch.equal(weights_a[name], weights_b[name]), name


@pytest.mark.reliability
def test_a_resume_computes_with_the_kernels_its_checkpoint_recorded(tmp_path, monkeypatch):
    """The loss kernel chosen by timing (torch's), recorded in the checkpoint; the cache then gone and the timing now
    favouring ours: the resumed run still computes with torch's, as the run began (bit for bit needs the same kernels)."""
    from aiayn.inference import kernel_choice

    monkeypatch.setattr(kernel_choice, "cache_path", lambda: tmp_path / "kernels.json")  # (the native library's build stays)
    monkeypatch.setenv("AIAYN_LOSS_KERNEL", "measure")
    for name in ("_PINNED", "_MADE", "_NATIVE_CHOSEN"):
        monkeypatch.setattr(kernel_choice, name, {})
    monkeypatch.setattr(kernel_choice, "gemv_available", lambda: True)
    monkeypatch.setattr(kernel_choice, "_others_share", lambda start, end: 0.0)
    monkeypatch.setattr(kernel_choice, "_time_cross_entropy", lambda dtype, rounds=5: {"torch": 1.0, "native": 2.0})
    config = lm_config(tmp_path, steps=2, save_every=1, eval_every=2)
    train(replace_loop(config, stop_after=1))
    record = load_checkpoint(tmp_path / "run" / "step-000001").trainer.kernels
    loss = "cross_entropy float32 (torch/native)"
    assert record == {"machine": kernel_choice.machine_key(), "choices": {loss: "torch"}}

    kernel_choice.cache_path().unlink()
    kernel_choice._NATIVE_CHOSEN.clear()  # a new process
    monkeypatch.setattr(kernel_choice, "_time_cross_entropy", lambda dtype, rounds=5: pytest.fail("timed a recorded choice"))
    result = train(config)  # resumes at step 1
    assert result.last_checkpoint is not None and result.last_checkpoint.name == "step-000002"
    assert kernel_choice._NATIVE_CHOSEN["cross_entropy", torch.float32] == "torch"
    assert load_checkpoint(result.last_checkpoint).trainer.kernels == record
    assert not kernel_choice._PINNED  # for that run only: what runs next in this process chooses its own


def torchrun(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'tests' / 'training'}", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=timeout)


@pytest.mark.slow
def test_two_gloo_ranks_equal_one_process_with_accumulation(tmp_path):
    """DDP over 2 ranks (rank r takes batches r, r+2, ...) == 1 process accumulating 2 micro-batches per step.

    The loss is normalised by the target tokens of the whole step on all ranks, so the updates are
    the same up to float summation order. Dropout 0, since ranks draw different masks.
    """
    config = translation_config(tmp_path / "ddp", steps=4, dropout=0.0, save_every=4)
    ddp = torchrun("-m", "aiayn", "train", str(save_config(config, tmp_path / "ddp.yaml")))
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    single = train(replace_loop(translation_config(tmp_path / "one", steps=4, dropout=0.0, save_every=4), accumulate=2))
    losses_ddp, losses_one = step_losses(tmp_path / "ddp" / "run"), step_losses(single.run_dir)
    assert sorted(losses_ddp) == [1, 2, 3, 4]
    for step in losses_one:
        assert losses_ddp[step] == pytest.approx(losses_one[step], abs=1e-5)
    ddp_weights, _ = read_safetensors(tmp_path / "ddp" / "run" / "step-000004" / "model.safetensors")
    for name, tensor in single.model.state_dict().items():
        if name.endswith("w_k.bias"):
            # The key bias adds the same q.b to every score of a row, which softmax ignores: its true
            # gradient is 0, the computed one is rounding noise, and Adam turns noise into full-size steps.
            continue
        torch.testing.assert_close(ddp_weights[name], tensor, atol=1e-5, rtol=1e-5, msg=name)


@pytest.mark.slow
@pytest.mark.reliability
def test_a_failing_rank_stops_every_rank(tmp_path):
    """Rank 1 raises at step 2: torchrun ends the other rank too and exits non-zero, well within the timeout."""
    config = translation_config(tmp_path, steps=50, dropout=0.0)
    path = save_config(config, tmp_path / "c.yaml")
    out = torchrun(str(ROOT / "tests" / "training" / "ddp_failing_worker.py"), str(path), timeout=120)
    assert out.returncode != 0
    assert "rank 1 fails on purpose" in out.stderr + out.stdout


@pytest.mark.reliability
def test_non_finite_loss_raises_naming_the_step_and_keeps_checkpoints(tmp_path, monkeypatch):
    config = lm_config(tmp_path, steps=8, save_every=2, eval_every=2)
    original = Objective.forward
    calls = {"n": 0}

    def exploding(self, batch):
        loss = original(self, batch)
        calls["n"] += self.training
        if self.training and calls["n"] == 5:  # the 5th training micro-batch: step 5
            return type(loss)(loss.sum * float("inf"), loss.count)
        return loss

    monkeypatch.setattr(Objective, "forward", exploding)
    with pytest.raises(FloatingPointError, match="non-finite loss .* at step 5; stopped before the optimizer step"):
        train(config)
    names = [p.name for p in list_checkpoints(Path(config.run_dir))]
    assert names[-1] == "step-000004"  # the last finite checkpoint survives

    calls["n"] = 0
    skipping = replace_loop(lm_config(tmp_path / "skip", steps=6), nonfinite="skip")
    result = train(skipping)
    assert result.step == 6
    for name, tensor in result.model.state_dict().items():
        assert torch.isfinite(tensor).all(), name


@pytest.mark.reliability
def test_resume_errors_name_the_path(tmp_path):
    config = lm_config(tmp_path, steps=2)
    with pytest.raises(FileNotFoundError, match=f"resume path does not exist: {tmp_path / 'nowhere'}"):
        train(config, resume=str(tmp_path / "nowhere"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=f"no complete checkpoint in {tmp_path / 'empty'}"):
        train(config, resume=str(tmp_path / "empty"))


@pytest.mark.reliability
def test_resume_with_changed_model_lists_the_changes(tmp_path):
    config = lm_config(tmp_path, steps=2)
    train(config)
    changed = dataclasses.replace(config, model=config.model.replace(d_ff=48), train=dataclasses.replace(config.train, max_steps=4))
    with pytest.raises(ValueError, match=r"the model config changed \(d_ff: checkpoint 64, config 48\)"):
        train(changed)


def test_a_field_added_since_the_checkpoint_counts_as_its_default(tmp_path):
    """Checkpoints saved before a model field existed still resume (the field takes its default)."""
    result = train(lm_config(tmp_path, steps=2))
    checkpoint = load_checkpoint(result.last_checkpoint)
    older = dataclasses.replace(checkpoint, config={k: v for k, v in checkpoint.config.items() if k != "rope_base"})
    _check_same_model(older, result.model.config)  # no error
    changed = dataclasses.replace(checkpoint, config={**checkpoint.config, "d_ff": 48})
    with pytest.raises(ValueError, match=r"d_ff: checkpoint 48, config 64"):
        _check_same_model(changed, result.model.config)


def test_a_run_may_change_its_attention_kernel_when_it_resumes(tmp_path):
    """The kernel computes the same function: checkpoints saved with "sdpa" (the old default) resume under "auto"."""
    result = train(lm_config(tmp_path, steps=2))
    checkpoint = load_checkpoint(result.last_checkpoint)
    assert checkpoint.config["attention_backend"] == "auto"
    _check_same_model(dataclasses.replace(checkpoint, config={**checkpoint.config, "attention_backend": "sdpa"}), result.model.config)


@pytest.mark.reliability
def test_corrupt_newest_checkpoint_falls_back_with_a_warning(tmp_path):
    config = lm_config(tmp_path, steps=6, save_every=3)
    train(config)
    weights = Path(config.run_dir) / "step-000006" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])  # truncated
    longer = replace_loop(config, max_steps=9)
    with pytest.warns(UserWarning, match="step-000006"):
        result = train(longer)
    assert result.step == 9
    losses = step_losses(Path(config.run_dir))
    assert 4 in losses and 9 in losses  # steps 4..9 were (re)done from step 3


@pytest.mark.reliability
def test_fresh_start_refuses_a_used_run_dir(tmp_path):
    config = lm_config(tmp_path, steps=2)
    train(config)
    with pytest.raises(ValueError, match="already holds checkpoints"):
        train(config, resume=False)


@pytest.mark.reliability
def test_cli_rejects_unknown_and_mistyped_keys(tmp_path):
    path = save_config(lm_config(tmp_path, steps=2), tmp_path / "c.yaml")
    out = run_cli("train", str(path), "--set", "optim.lrr=0.1")
    assert out.returncode == 2
    assert "unknown key 'optim.lrr'" in out.stderr and "did you mean 'optim.lr'" in out.stderr
    out = run_cli("train", str(path), "--set", "train.max_steps=many")
    assert out.returncode == 2 and "train.max_steps: expected int, got 'many'" in out.stderr


def test_bf16_autocast_trains(tmp_path):
    result = train(replace_loop(lm_config(tmp_path, steps=3), precision="bf16"))
    assert result.step == 3 and all(torch.isfinite(torch.tensor(v)) for v in step_losses(result.run_dir).values())


def test_init_from_masked_lm_pretraining(tmp_path):
    """Masked-LM pre-training, then a classifier that starts from its weights and tokenizer."""
    from aiayn.training.config import DataSection, ModelSection, TrainConfig

    rows = [f"{i % 2}\t{'good fine great' if i % 2 else 'bad awful poor'} movie number {i}" for i in range(60)]
    tsv = tmp_path / "data.tsv"
    tsv.write_text("\n".join(rows) + "\n")
    base = lm_config(tmp_path / "x", steps=2)
    model = ModelSection(preset="tiny-encoder-only", dropout=0.0, max_len=32)
    data = DataSection(task="mlm", dataset="files", train_files=[str(tsv)], val_files=[str(tsv)], tokenizer="char", batch_size=8, max_len=32)
    pre = train(TrainConfig(run_dir=str(tmp_path / "mlm"), model=model, data=data, optim=base.optim, schedule=base.schedule, train=base.train))
    cls_data = dataclasses.replace(data, task="classification")
    fine = TrainConfig(run_dir=str(tmp_path / "cls"), model=model, data=cls_data, optim=base.optim, schedule=base.schedule,
                       train=dataclasses.replace(base.train, init_from=str(pre.run_dir), max_steps=1, eval_every=1))
    result = train(fine)
    assert "val_accuracy" in result.metrics
    assert result.data.src_tokenizer.encode("good") == pre.data.src_tokenizer.encode("good")
    with pytest.raises(FileNotFoundError, match="train.init_from: no such directory"):
        train(dataclasses.replace(fine, run_dir=str(tmp_path / "c2"), train=dataclasses.replace(fine.train, init_from=str(tmp_path / "no"))))


def test_masked_lm_loss_only_scores_predicted_positions():
    """Scoring only the labelled positions gives the loss of scoring all of them and ignoring the rest."""
    from aiayn import build_model
    from aiayn.data import MLMBatch
    from aiayn.training.losses import masked_lm_loss

    torch.manual_seed(0)
    model = build_model("tiny-encoder-only").eval()
    ids = torch.randint(7, 64, (3, 9))
    labels = torch.full_like(ids, -100)
    labels[0, 2], labels[1, 5], labels[2, 0], labels[2, 8] = 11, 12, 13, 14
    batch = MLMBatch(input=ids, labels=labels, pad_mask=torch.ones_like(ids, dtype=torch.bool), segment_ids=torch.zeros_like(ids))
    loss = Objective(model, "mlm")(batch)
    full = masked_lm_loss(model.masked_lm_logits(model(ids)), labels)
    torch.testing.assert_close(loss.sum, full.sum)
    assert int(loss.count) == int(full.count) == 4


@pytest.mark.parametrize("steps", [7, 0])
def test_the_allocator_holds_freed_memory_for_the_configured_steps(tmp_path, monkeypatch, steps):
    """After its third step a run asks the allocator to keep freed memory train.hold_freed_steps steps' time
    (measured from steps 2 and 3); 0 leaves the allocator's own delay."""
    import aiayn.training.loop as loop_module

    asked: list[float] = []
    monkeypatch.setattr(loop_module, "hold_freed_memory", lambda seconds: asked.append(seconds) or None)
    train(replace_loop(lm_config(tmp_path, steps=5), hold_freed_steps=steps))
    assert len(asked) == (1 if steps else 0)
    assert all(0 < seconds < steps * 60 for seconds in asked)


@pytest.mark.parametrize("bad", [-1, 1001, 2.5, "ten"])
def test_a_bad_hold_is_refused_naming_the_key(bad):
    from aiayn.training.config import LoopSection

    with pytest.raises(ValueError, match=rf"train\.hold_freed_steps={bad!r} must be an int in \[0, 1000\]"):
        LoopSection(hold_freed_steps=bad)
