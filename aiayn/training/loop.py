"""``train(config)``: one readable loop for all three families, resumable and data-parallel.

``_train`` builds the run (data, model, optimizer, maybe a resumed state); ``_loop`` then reads like
the algorithm: step (``TrainStep``: accumulate, backward, clip, handle non-finite values), log,
evaluate every ``eval_every`` steps, save every ``save_every`` steps (``_Saver``: an atomic
checkpoint that holds everything needed to continue bit for bit).
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
from torch import nn

from aiayn.allocator import describe as describe_allocator
from aiayn.allocator import hold_freed_memory, set_mmap_threshold, set_onednn_cache_capacity
from aiayn.checkpoint.atomic_io import atomic_write_bytes
from aiayn.checkpoint.directory import MARKER, STEP_DIR, set_aside_newer, warn_incomplete
from aiayn.checkpoint.retention import RetentionConfig, rotate_checkpoints, update_best
from aiayn.checkpoint.rng_state import capture_rng_state, restore_rng_state
from aiayn.checkpoint.sharded import load_sharded_state, save_sharded_checkpoint
from aiayn.checkpoint.state import (
    BestValue,
    Checkpoint,
    RankState,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    resolve_checkpoint,
    restore_training_state,
    save_checkpoint,
)
from aiayn.config_io import save_yaml
from aiayn.data.batching import padded_length
from aiayn.evaluation.during_training import bleu_eval_hook
from aiayn.inference.kernel_choice import adopt_native, choose_native, pin_choices
from aiayn.models.config import TransformerConfig, with_defaults
from aiayn.models.presets import model_class
from aiayn.nn.embedding import use_row_gradients
from aiayn.nn.onednn_linear import training_kernel_choice, use_training_kernels
from aiayn.pretrained import LABELS_FILE
from aiayn.tokenization.compat import check_tokenizer_fits
from aiayn.tokenization.io import load_tokenizer_pair, save_tokenizer_pair
from aiayn.training.activation_checkpointing import apply_activation_checkpointing
from aiayn.training.config import LoopSection, TrainConfig, build_model_config
from aiayn.training.distributed import DistInfo, all_gather_objects, any_rank, init_distributed, shutdown
from aiayn.training.evaluate import validate
from aiayn.training.fsdp import check_under_torchrun, shard_model
from aiayn.training.init_from import InitSource, check_family, init_model_config, load_init_weights, read_init
from aiayn.training.master_weights import MasterWeights
from aiayn.training.metrics_log import MetricsLog, peak_rss_bytes
from aiayn.training.objectives import Objective
from aiayn.training.optim import build_optimizer, build_scheduler
from aiayn.training.precision import MASTER, MASTER_NAMES, autocast_context, resolve_precision
from aiayn.training.preemption import Preemption, TrainingInterrupted
from aiayn.training.progress import Progress, progress_bar
from aiayn.training.step import StepResult, TrainStep
from aiayn.training.tasks import TaskData, build_task_data, check_classes, size_hint

__all__ = ["train", "TrainResult", "EvalHook", "TrainingInterrupted"]

log = logging.getLogger(__name__)
EvalHook = Callable[[nn.Module, TaskData, int], dict[str, float]]  # (model, data, step) -> extra metrics


@dataclass
class TrainResult:
    run_dir: Path
    step: int
    model: nn.Module
    data: TaskData
    last_checkpoint: Path | None
    metrics: dict[str, float] = field(default_factory=dict)


def train(config: TrainConfig, *, resume: bool | str = "auto", eval_hook: EvalHook | None = None) -> TrainResult:
    """Train as ``config`` says; ``resume``: ``"auto"`` (the newest complete checkpoint of ``run_dir``
    if any), ``False`` (start fresh; ``run_dir`` must hold no checkpoint), or a checkpoint/run path."""
    loop = config.train
    if loop.onednn_cache_capacity is not None:  # first: oneDNN reads it at its first primitive
        set_onednn_cache_capacity(loop.onednn_cache_capacity)
    device = _device(loop.device)
    fsdp = loop.parallel == "fsdp"
    if loop.cpu_offload and device.type != "cuda":
        raise ValueError(f"train.cpu_offload=true moves FSDP shards from the GPU to CPU memory; device is {device}, nothing to offload")
    if fsdp:
        check_under_torchrun()
    dist_info = init_distributed(device, always=fsdp)
    if device.type == "cuda" and dist_info.enabled:
        device = torch.device("cuda", dist_info.local_rank)
    run_dir = Path(config.run_dir)
    checkpoint = _resume_point(run_dir, resume, sharded=fsdp)
    if checkpoint is not None:
        _check_world_size(checkpoint, dist_info.world_size, resplit=fsdp)  # before anything in run_dir is moved
    if checkpoint is not None and dist_info.is_main:
        set_aside_newer(run_dir, checkpoint.step)
    finished = False
    # a resume computes with the kernels its run began with (bit for bit), for this run only; a new run with its own
    pin_choices(checkpoint.trainer.kernels if checkpoint is not None and checkpoint.trainer is not None else None,
                str(checkpoint.path) if checkpoint is not None else "")
    try:
        result = _train(config, run_dir, device, dist_info, checkpoint, _with_bleu(eval_hook, loop.eval_bleu))
        finished = True
        return result
    finally:
        pin_choices(None)  # what runs next in this process (decoding the result, another run) times or reads its own
        shutdown(dist_info, together=finished)


def _check_world_size(checkpoint: Checkpoint, world_size: int, *, resplit: bool = False) -> None:
    """Refuse to resume a checkpoint saved by a different number of DDP ranks (unless ``resplit``).

    The weights and optimizer are the same on every DDP rank, but each rank's loader position and
    dropout generators are its own: with another world size the data order (and so the run) would
    silently differ from an uninterrupted one. ``resplit``: a sharded (FSDP) run re-splits instead.
    """
    saved = len(checkpoint.ranks) + 1
    if saved != world_size and not resplit:
        raise ValueError(
            f"cannot resume {checkpoint.path} with {world_size} process(es): it was saved by {saved} data-parallel "
            f"rank(s), each with its own loader position and generators. Resume it with "
            f"`torchrun --nproc_per_node={saved}`" + (" (or without torchrun)" if saved == 1 else "")
            + f", or start a new run from its weights with train.init_from={checkpoint.path} and another run_dir"
        )


def _rank_state(checkpoint: Checkpoint, rank: int, world_size: int, *, resplit: bool = False) -> dict[str, Any]:
    """Restore rank ``rank``'s own generators (rank 0's come with the checkpoint); return its loader state.

    ``resplit`` (FSDP, whose model and optimizer state DCP reshards): a checkpoint of another world
    size continues from the same place in the data, each rank taking its share of the batches.
    """
    saved = len(checkpoint.ranks) + 1
    if resplit and saved != world_size:
        assert checkpoint.trainer is not None  # load_checkpoint read it
        return _resplit_loader_state(checkpoint, checkpoint.trainer.data or {}, rank, world_size)
    if rank == 0:
        assert checkpoint.trainer is not None  # restore_training_state checked it
        return checkpoint.trainer.data or {}
    state = checkpoint.ranks.get(rank)
    if state is None:
        raise ValueError(
            f"{checkpoint.path} was saved by {saved} data-parallel rank(s) and holds no state for rank {rank}: "
            f"resume it with --nproc_per_node={saved}, or start a new run (train.init_from) to change the world size"
        )
    restore_rng_state(state.rng.tensors, state.rng.meta)
    return state.data or {}


def _resplit_loader_state(checkpoint: Checkpoint, state: dict[str, Any], rank: int, world_size: int) -> dict[str, Any]:
    """Rank 0's loader state at ``saved`` ranks as rank ``rank``'s of ``world_size``: the same global batch count."""
    saved = state.get("world_size", 1)
    consumed = state.get("position", 0) * saved  # batches of this epoch taken by all ranks together
    if consumed % world_size:
        raise ValueError(
            f"{checkpoint.path} stopped after {consumed} batches of its epoch over {saved} rank(s), which "
            f"{world_size} rank(s) cannot split evenly: resume it with --nproc_per_node={saved}"
        )
    log.info("resuming %d rank(s) as %d: the data position is re-split", saved, world_size)
    return {**state, "rank": rank, "world_size": world_size, "position": consumed // world_size}


def _with_bleu(eval_hook: EvalHook | None, sentences: int) -> EvalHook | None:
    """``eval_hook`` plus, if ``sentences`` > 0, greedy BLEU on that many validation sentences."""
    if not sentences:
        return eval_hook
    bleu = bleu_eval_hook(sentences)
    if eval_hook is None:
        return bleu
    return lambda model, data, step: {**bleu(model, data, step), **eval_hook(model, data, step)}


def _train(
    config: TrainConfig,
    run_dir: Path,
    device: torch.device,
    dist_info: DistInfo,
    checkpoint: Checkpoint | None,
    eval_hook: EvalHook | None,
) -> TrainResult:
    loop = config.train
    fsdp = loop.parallel == "fsdp"
    master_ok = not (dist_info.enabled or fsdp or loop.compile)
    if loop.malloc_mmap_threshold is not None:  # before the data: its blocks are freed and reused too
        set_mmap_threshold(loop.malloc_mmap_threshold)
    if loop.precision in MASTER_NAMES and not master_ok:
        raise ValueError(f"train.precision={loop.precision} trains in one process without train.compile (its bf16 copies "
                         "are not what DDP, FSDP or torch.compile see); use train.precision=bf16 (autocast) there")
    torch.manual_seed(loop.seed)  # same initial weights on every rank
    init = read_init(loop.init_from) if loop.init_from and checkpoint is None else None
    if init is not None:
        check_family(init, config.model.family)
    tokenizers = load_tokenizer_pair(checkpoint.path) if checkpoint else (init.tokenizers if init else None)
    data = build_task_data(config.data, seed=loop.seed, rank=dist_info.rank, world_size=dist_info.world_size, tokenizers=tokenizers)
    model_config = _model_config(config, data, init)
    check_classes(getattr(model_config, "n_classes", 0), data)
    _check_lengths(config, model_config)
    _check_vocabularies(data, model_config)
    model = model_class(model_config)(model_config).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    precision = resolve_precision(loop.precision, device, n_params=n_params, master_ok=master_ok)
    if loop.precision == "auto":
        log.info("train.precision=auto: %s on this %s", precision, device.type)
    if device.type == "cpu" and dist_info.is_main:
        log.info("memory allocator: %s", describe_allocator())  # the peak_rss_mb of the metrics depends on it
    if config.data.dataset == "files" and dist_info.is_main:
        log.info(size_hint(data, n_params, pretrained=loop.init_from is not None))
    # fp32: oneDNN or MKL, per shape; bf16 with batches of fixed rows (language modelling): each product's rows in one
    # call or two, per shape at those rows; by timing them here
    matmul_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, MASTER: torch.bfloat16}.get(precision)  # fp16: none
    fixed_rows = config.data.task == "lm"
    if device.type == "cpu" and not fsdp and matmul_dtype is not None and (matmul_dtype == torch.float32 or fixed_rows):
        rows, kernels = config.data.batch_tokens(), None
        if dist_info.enabled:  # rank 0 times alone (a rank timing beside it slows its two-thread kernels); all take its answer
            kernels = all_gather_objects(training_kernel_choice(model, rows, matmul_dtype) if dist_info.is_main else None,
                                         dist_info)[0]
        use_training_kernels(model, rows, kernels=kernels, dtype=matmul_dtype)
    if device.type == "cpu" and not fsdp and not loop.compile and config.data.task in ("lm", "translation"):
        if use_row_gradients(model):  # tied embeddings' gradients as their rows, added into the output projection's
            log.info("tied embedding: its lookup's gradient passed back as rows (a sparse tensor), added into the output "
                     "projection's dense one")
    if device.type == "cpu":
        # our kernels or torch's for GPT-2's GELU, the loss and dropout, timed once here (rank 0 alone, as above) rather
        # than in the first step; dropout meets fp32 (the embeddings' sums) and, under autocast, bf16 (sublayer outputs)
        native_dtype = torch.float32 if precision == "float32" else torch.bfloat16
        ops = [("cross_entropy", native_dtype)]
        if any(getattr(m, "activation", None) == "gelu_tanh" for m in model.modules()):
            ops.append(("gelu_tanh", native_dtype))
        if any(getattr(model_config, key, 0.0) for key in ("dropout", "attention_dropout", "activation_dropout")):
            ops += [("dropout", dtype) for dtype in dict.fromkeys((torch.float32, native_dtype))]
        choices = [choose_native(op, dtype) for op, dtype in ops] if dist_info.is_main else None
        if dist_info.enabled:
            choices = all_gather_objects(choices, dist_info)[0]
        for (op, dtype), choice in zip(ops, choices):  # type: ignore[arg-type]  # rank 0's answers
            adopt_native(op, dtype, choice)
    if loop.activation_checkpointing:
        apply_activation_checkpointing(model)
    if fsdp:
        shard_model(model, bf16=precision == "bfloat16", cpu_offload=loop.cpu_offload)
    optimizer = build_optimizer(model, config.optim)
    scheduler = build_scheduler(optimizer, config.schedule.resolve(max_steps=loop.max_steps, d_model=model_config.d_model))
    step, best = 0, None
    scaler = torch.amp.GradScaler(device.type, enabled=precision == "float16")  # fp16: skip overflows, adapt the scale
    if checkpoint is not None:
        _check_same_model(checkpoint, model_config)
        if fsdp:
            load_sharded_state(checkpoint.path, model, optimizer)
            restore_training_state(checkpoint, scheduler=scheduler, rng=True)
        else:
            restore_training_state(checkpoint, model=model, optimizer=optimizer, scheduler=scheduler, rng=True)
        data.train.load_state_dict(_rank_state(checkpoint, dist_info.rank, dist_info.world_size, resplit=fsdp))
        assert checkpoint.trainer is not None  # restore_training_state checked it
        step, best = checkpoint.step, checkpoint.trainer.best
        _restore_scaler(scaler, checkpoint)
        log.info("resumed from %s at step %d", checkpoint.path, step)
    else:
        if init is not None:
            load_init_weights(model, init)  # strict but for a new head: lists missing, unexpected and mis-shaped weights
            log.info("initialised the weights from %s", init.path)
        if dist_info.rank:
            torch.manual_seed(loop.seed + dist_info.rank)  # different dropout masks per rank

    objective = Objective(model, data.task, label_smoothing=loop.label_smoothing)
    runner: nn.Module = torch.compile(objective) if loop.compile else objective  # type: ignore[assignment]
    if dist_info.enabled and not fsdp:
        runner = nn.parallel.DistributedDataParallel(runner, device_ids=[device.index] if device.type == "cuda" else None)
    autocast = autocast_context(precision, device)  # validation's; a bf16-master step runs on its bf16 copies instead
    master = MasterWeights(model) if precision == MASTER else None  # after a resume: copies of the restored masters
    train_step = TrainStep(
        runner, model, optimizer, scheduler=scheduler,
        grad_clip=loop.grad_clip, nonfinite=loop.nonfinite, autocast=contextlib.nullcontext if master else autocast,
        scaler=scaler, dist_info=dist_info, device=device, master=master,
    )
    saver = _Saver(run_dir, model, model_config, optimizer, scheduler, data, dist_info, loop.retention, sharded=fsdp)
    saver.scaler = scaler
    metrics_log = None
    if dist_info.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        save_yaml(config, run_dir / "train_config.yaml")
        tokenizer_files = save_tokenizer_pair(run_dir / "tokenizer", data.src_tokenizer, data.tgt_tokenizer)
        saver.extra_files = [run_dir / "train_config.yaml", *tokenizer_files]
        if data.label_names:  # classify prints these names; every checkpoint carries them
            atomic_write_bytes(run_dir / LABELS_FILE, (json.dumps({"labels": data.label_names}) + "\n").encode())
            saver.extra_files.append(run_dir / LABELS_FILE)
        metrics_log = MetricsLog(run_dir, tensorboard=loop.tensorboard, resume_step=step if checkpoint else None)

    def evaluate(step: int) -> dict[str, float]:
        metrics = validate(objective, data.val, device=device, autocast=autocast, max_batches=loop.eval_batches)
        if eval_hook is not None:
            metrics.update(eval_hook(model, data, step))
        return metrics

    try:
        with Preemption(dist_info, device) as preemption:  # SIGINT/SIGTERM: finish the step, save, stop
            last_saved, step, metrics = _loop(loop, step, best, data, train_step, evaluate, saver, metrics_log, dist_info, device,
                                              preemption)
    finally:
        if metrics_log is not None:
            metrics_log.close()
    return TrainResult(run_dir, step, model, data, last_saved, metrics)


def _loop(
    loop: LoopSection,
    step: int,
    best: BestValue | None,
    data: TaskData,
    train_step: TrainStep,
    evaluate: Callable[[int], dict[str, float]],
    saver: _Saver,
    metrics_log: MetricsLog | None,
    dist_info: DistInfo,
    device: torch.device,
    preemption: Preemption | None = None,
) -> tuple[Path | None, int, dict[str, float]]:
    """Step until ``max_steps`` (or ``stop_after``, or ``max_minutes``); log, validate and save on schedule.

    Returns the last checkpoint written (rank 0), the last step and the last validation metrics. Raises
    ``TrainingInterrupted`` after saving when ``preemption`` saw SIGINT/SIGTERM.
    """
    end = loop.stop_after or loop.max_steps
    batches = _forever(data.train)
    bar = progress_bar(loop, step, enabled=loop.progress and dist_info.is_main)  # steps, or the time budget
    metrics: dict[str, float] = {}
    last_saved, metrics_step, tokens, started = None, -1, 0, time.perf_counter()  # metrics_step: when metrics were made
    micro_batches, saved_at = loop.micro_batches(dist_info.world_size), started
    timed: list[float] = []  # when each of this process's first three steps ended
    train_step.model.train()
    while step < end:
        result = train_step([next(batches).to(device, non_blocking=True) for _ in range(micro_batches)], step + 1)
        if result is None:  # a non-finite step, dropped (train.nonfinite=skip)
            continue
        step += 1
        tokens += result.targets
        bar.update(1)
        if len(timed) < 3:
            timed.append(time.perf_counter())
            if len(timed) == 3 and device.type == "cpu" and loop.hold_freed_steps:  # two steps after the warm-up one
                _hold_freed_memory(loop.hold_freed_steps, (timed[2] - timed[0]) / 2)
        if loop.max_minutes is not None and _out_of_time(started, loop.max_minutes, dist_info, device):
            log.info("train.max_minutes=%s spent: stopping at step %d", loop.max_minutes, step)
            end = step  # the checks below then log, validate and save this step as the last

        if metrics_log is not None and (step % loop.log_every == 0 or step == end):
            lr = train_step.optimizer.param_groups[0]["lr"]
            _log(metrics_log, bar, step, result, lr, tokens / max(time.perf_counter() - started, 1e-9))
        if step % loop.eval_every == 0 or step in (loop.max_steps, end):
            metrics, metrics_step = evaluate(step), step
            if metrics_log is not None:
                metrics_log.write(step, metrics)
            log.info("step %d: %s", step, ", ".join(f"{k} {v:.4f}" for k, v in metrics.items()))
        due = loop.save_every_minutes is not None and _out_of_time(saved_at, loop.save_every_minutes, dist_info, device)
        saved = step % loop.save_every == 0 or step == end or due
        if saved:
            last_saved, best = saver.save(step, metrics if metrics_step == step else {}, best)
            saved_at = time.perf_counter()
        signum = preemption.requested() if preemption is not None and step < end else None
        if signum is not None:  # every rank agreed: save this step (if not just saved) and stop
            if not saved:
                last_saved, best = saver.save(step, metrics if metrics_step == step else {}, best)
            bar.close()
            raise TrainingInterrupted(signum, step, last_saved)
    bar.close()
    return last_saved, step, metrics


def _hold_freed_memory(steps: int, step_seconds: float) -> None:
    """Have the allocator keep freed memory ``steps`` steps' time before returning it (see :mod:`aiayn.allocator`)."""
    delay = hold_freed_memory(steps * step_seconds)
    if delay is not None:
        log.info("mimalloc keeps freed memory %.1f s (%d steps of %.2f s) before returning it (train.hold_freed_steps)",
                 delay / 1000, steps, step_seconds)


def _log(metrics_log: MetricsLog, bar: Progress, step: int, result: StepResult, lr: float, tokens_per_s: float) -> None:
    rss = peak_rss_bytes() / 2**20
    record = {"loss": result.loss, "lr": lr, "grad_norm": result.grad_norm, "tokens_per_s": tokens_per_s, "peak_rss_mb": rss}
    metrics_log.write(step, record)
    bar.set_postfix(loss=f"{result.loss:.4f}", lr=f"{lr:.2e}", tok_s=f"{tokens_per_s:.0f}", rss=f"{rss:.0f}MB")


class _Saver:
    """Writes the run's checkpoints (rank 0), with every rank's generators and loader position, and rotates them."""

    def __init__(
        self,
        run_dir: Path,
        model: nn.Module,
        model_config: TransformerConfig,
        optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler,
        data: TaskData,
        dist_info: DistInfo,
        retention: RetentionConfig,
        *,
        sharded: bool = False,
    ) -> None:
        self.run_dir, self.model, self.model_config, self.optimizer, self.scheduler = run_dir, model, model_config, optimizer, scheduler
        self.data, self.dist, self.retention, self.sharded = data, dist_info, retention, sharded
        self.extra_files: list[Path] = []  # copied into every checkpoint (the config, the tokenizers)
        self.scaler: torch.amp.GradScaler | None = None  # fp16's, saved so a resume continues its scale

    def save(self, step: int, metrics: dict[str, float], best: BestValue | None) -> tuple[Path | None, BestValue | None]:
        """Checkpoint ``step`` with its validation ``metrics`` (empty if none at this step); return (path, best)."""
        # Every rank's generators and loader position: a resumed rank continues its own.
        ranks = []
        if self.dist.enabled or self.sharded:
            ranks = all_gather_objects(RankState(capture_rng_state(), self.data.train.state_dict()), self.dist)[1:]
        scaler = self.scaler.state_dict() if self.scaler is not None and self.scaler.is_enabled() else None
        if self.sharded:  # every rank writes its shards
            best = update_best(best, metrics, step=step, retention=self.retention)
            path = save_sharded_checkpoint(
                self.run_dir, step=step, model=self.model, optimizer=self.optimizer, config=self.model_config,
                scheduler=self.scheduler, data_state=self.data.train.state_dict(), metrics=metrics, best=best,
                extra_files=self.extra_files, ranks=ranks, scaler=scaler,
            )
            if self.dist.is_main:
                rotate_checkpoints(self.run_dir, self.retention)
            return path, best
        if not self.dist.is_main:
            return None, best
        best = update_best(best, metrics, step=step, retention=self.retention)
        path = save_checkpoint(
            self.run_dir, step=step, model=self.model, config=self.model_config, optimizer=self.optimizer,
            scheduler=self.scheduler, data_state=self.data.train.state_dict(), metrics=metrics, best=best,
            extra_files=self.extra_files, ranks=ranks, scaler=scaler,
        )
        rotate_checkpoints(self.run_dir, self.retention)
        return path, best


def _resume_point(run_dir: Path, resume: bool | str, *, sharded: bool = False) -> Checkpoint | None:
    """The checkpoint to continue from, or None to start fresh; ``sharded``: a DCP one (train.parallel=fsdp)."""
    def load(path: Path) -> Checkpoint:  # each checkpoint is verified (hashed) once, by the finder
        return load_checkpoint(path, verified=True, sharded=sharded)

    if resume is False:
        if list_checkpoints(run_dir):
            raise ValueError(f"{run_dir} already holds checkpoints: resume (the default) or choose another run_dir")
        _refuse_interrupted(run_dir)
        return None
    if resume in (True, "auto"):
        if not list_checkpoints(run_dir):
            _refuse_interrupted(run_dir)
            if resume is True:
                raise FileNotFoundError(f"nothing to resume: no complete checkpoint in {run_dir}")
            return None
        return load(latest_checkpoint(run_dir))
    return load(resolve_checkpoint(str(resume)))


def _restore_scaler(scaler: torch.amp.GradScaler, checkpoint: Checkpoint) -> None:
    """fp16: continue the saved loss scale (a fresh scale would overflow again for a few steps)."""
    saved = checkpoint.trainer.scaler if checkpoint.trainer is not None else None
    if scaler.is_enabled() and saved is not None:
        scaler.load_state_dict(saved)
    elif scaler.is_enabled():
        log.warning("%s holds no fp16 gradient-scaler state: starting from a fresh scale", checkpoint.path)


def _refuse_interrupted(run_dir: Path) -> None:
    """No complete checkpoint but interrupted saves: starting over would collide with them, so stop."""
    interrupted = [p.name for p in warn_incomplete(run_dir) if STEP_DIR.match(p.name)]
    if interrupted:
        raise FileExistsError(
            f"{run_dir} holds no complete checkpoint, only interrupted saves without a {MARKER} marker "
            f"({', '.join(interrupted)}): there is nothing to resume, and a new run would collide with them. "
            "Move or delete them, or choose another run_dir"
        )


def _check_same_model(checkpoint: Checkpoint, model_config: TransformerConfig) -> None:
    """Refuse to resume into a model whose config changed, listing what changed.

    A field the checkpoint does not record (saved before the field existed) counts as its default.
    """
    saved, now = with_defaults(checkpoint.config), model_config.to_dict()
    # The attention kernel computes the same function: a run may change it when it resumes.
    changed = sorted(k for k in set(saved) | set(now) if saved.get(k) != now.get(k) and k != "attention_backend")
    if changed:
        details = ", ".join(f"{k}: checkpoint {saved.get(k)!r}, config {now.get(k)!r}" for k in changed)
        raise ValueError(f"cannot resume from {checkpoint.path}: the model config changed ({details})")


def _model_config(config: TrainConfig, data: TaskData, init: InitSource | None = None) -> TransformerConfig:
    """The section's model config, with vocabulary sizes and classes taken from the data when unset;
    with ``init`` and no ``preset`` / ``family``, the checkpoint's config with the section's fields over it."""
    section = config.model
    if init is not None and section.from_checkpoint:
        overrides = section.fixed_overrides()
        if data.task == "classification" and section.classes_from_data:
            overrides["n_classes"] = data.n_classes  # a new head when the checkpoint has none or another size
        if data.task == "classification" and getattr(init.config, "mlm_head", False) and "mlm_head" not in overrides:
            overrides["mlm_head"] = False  # the masked-LM head is not trained by a classifier
        return init_model_config(init, overrides)
    extra: dict[str, Any] = {}
    if data.src_tokenizer is not data.tgt_tokenizer and section.overrides.get("tgt_vocab_size") is None and data.task == "translation":
        extra = {"tgt_vocab_size": data.tgt_tokenizer.vocab_size, "share_embeddings": False}
    if data.task == "classification" and section.classes_from_data:
        extra["n_classes"] = data.n_classes
    model_config = build_model_config(section, vocab_size=data.src_tokenizer.vocab_size)
    return model_config.replace(**extra) if extra else model_config


def _out_of_time(started: float, minutes: float, dist_info: DistInfo, device: torch.device) -> bool:
    """Whether the time budget is spent, decided the same on every rank."""
    return any_rank(time.perf_counter() - started > 60 * minutes, dist_info, device)


def _check_lengths(config: TrainConfig, model_config: TransformerConfig) -> None:
    """Fail before training when the data can hold sequences longer than learned positions allow."""
    if model_config.positions != "learned":
        return
    longest = config.data.block_size if config.data.task == "lm" else config.data.max_len
    name = "data.block_size" if config.data.task == "lm" else "data.max_len"
    multiple = config.data.pad_to_multiple if config.data.task != "lm" else 1  # batches are padded up to this width
    if padded_length(longest, multiple) > model_config.max_len >= longest:
        raise ValueError(
            f"data.max_len={longest} rounded up to data.pad_to_multiple={multiple} is {padded_length(longest, multiple)}, "
            f"longer than model.max_len={model_config.max_len} (learned positions): lower data.max_len or "
            "data.pad_to_multiple, or raise model.max_len"
        )
    if longest > model_config.max_len:
        raise ValueError(
            f"{name}={longest} is longer than model.max_len={model_config.max_len} (learned positions): "
            f"lower {name} or raise model.max_len"
        )


def _check_vocabularies(data: TaskData, model_config: TransformerConfig) -> None:
    """Fail before building the model when a tokenizer has more ids than its embedding table."""
    check_tokenizer_fits(data.src_tokenizer, model_config.vocab_size, "model.vocab_size")
    if data.task == "translation" and hasattr(model_config, "target_vocab_size"):
        name = "model.tgt_vocab_size" if model_config.tgt_vocab_size is not None else "model.vocab_size (shared by the target)"  # type: ignore[attr-defined]
        check_tokenizer_fits(data.tgt_tokenizer, model_config.target_vocab_size, name)


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"train.device={name!r} but no CUDA device is available")
    return device


def _forever(loader: Any) -> Iterator[Any]:
    """Batches without end, epoch after epoch (the loader keeps its own position for resuming)."""
    while True:
        yield from loader
