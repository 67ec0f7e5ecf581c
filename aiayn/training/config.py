"""The training config: typed sections that map one-to-one onto a YAML file, with dotted overrides.

``aiayn train recipe.yaml --set optim.lr=5e-4 --set model.n_layers=4``; ``aiayn recipes`` lists the packaged examples (``aiayn/recipes/``).
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Any

from aiayn.models.config import (
    DecoderOnlyConfig,
    EncoderDecoderConfig,
    EncoderOnlyConfig,
    TransformerConfig,
    config_from_dict,
)
from aiayn.models.presets import preset
from aiayn.training.optim import OptimConfig, ScheduleConfig
from aiayn.checkpoint.retention import RetentionConfig

__all__ = ["ModelSection", "DataSection", "LoopSection", "TrainConfig", "build_model_config", "TASKS", "DATASET_NAMES"]

TASKS = ("translation", "lm", "mlm", "classification")
DATASET_NAMES = ("multi30k", "tinyshakespeare", "sst2", "files")


def _model_section_fields() -> list[tuple[str, Any, Any]]:
    """Every model-config field of every family, as an optional override (``None`` = keep the preset's)."""
    fields: dict[str, Any] = {}
    for cls in (EncoderDecoderConfig, DecoderOnlyConfig, EncoderOnlyConfig):
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if f.name not in fields:
                tp = hints[f.name]
                optional = tp if type(None) in typing.get_args(tp) else tp | None
                fields[f.name] = (f.name, optional, field(default=None))
    return [("preset", str | None, field(default=None)), ("family", str | None, field(default=None)), *fields.values()]


ModelSection = dataclasses.make_dataclass("ModelSection", _model_section_fields(), kw_only=True)
ModelSection.__module__ = __name__
ModelSection.__doc__ = (
    "The model: a ``preset`` (or a ``family`` built from defaults) plus any config field to override. "
    "``vocab_size`` defaults to the tokenizer's."
)


def build_model_config(section: Any, *, vocab_size: int | None = None) -> TransformerConfig:
    """The model config a ``ModelSection`` describes; ``vocab_size`` fills in when the section has none."""
    values = {k: v for k, v in dataclasses.asdict(section).items() if v is not None and k not in ("preset", "family")}
    if vocab_size is not None and "vocab_size" not in values:
        values["vocab_size"] = vocab_size
    if section.preset is not None:
        return preset(section.preset, **values)
    if section.family is not None:
        return config_from_dict({"family": section.family, **values})
    raise ValueError("model.preset or model.family is required (e.g. model.preset=tiny-decoder-only)")


@dataclass(kw_only=True)
class DataSection:
    """What to train on and how to batch it."""

    task: str = "lm"  # translation | lm (language modelling) | mlm (masked LM) | classification
    dataset: str = "tinyshakespeare"  # a named data set, or "files" with the paths below
    data_dir: str | None = None  # else $AIAYN_DATA_DIR, else the user cache (see docs/data.md)
    direction: str = "de-en"  # multi30k: source-target
    train_files: list[str] = field(default_factory=list)  # dataset=files: [src, tgt] | [text] | [tsv]
    val_files: list[str] = field(default_factory=list)
    tokenizer: str = "bpe"  # bpe | char
    vocab_size: int = 8000  # BPE vocabulary (ignored by char)
    shared_vocab: bool = True  # one vocabulary for source and target (the paper)
    max_len: int = 256  # longest sequence kept; longer ones are dropped or truncated
    too_long: str = "drop"  # drop | truncate | error
    max_tokens: int = 4096  # translation: token budget per batch and side (paper: 25000)
    batch_size: int = 32  # lm: windows per batch; mlm / classification: sentences per batch
    block_size: int = 64  # lm: context length
    num_workers: int = 0

    def __post_init__(self) -> None:
        _choice("data.task", self.task, TASKS)
        _choice("data.dataset", self.dataset, DATASET_NAMES)
        _choice("data.tokenizer", self.tokenizer, ("bpe", "char"))
        _choice("data.too_long", self.too_long, ("drop", "truncate", "error"))
        _choice("data.direction", self.direction, ("de-en", "en-de"))
        for name in ("vocab_size", "max_len", "max_tokens", "batch_size", "block_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"data.{name}={getattr(self, name)} must be >= 1")
        if self.num_workers < 0:
            raise ValueError(f"data.num_workers={self.num_workers} must be >= 0")
        if self.dataset == "files" and not self.train_files:
            raise ValueError("data.train_files is required when data.dataset=files")


@dataclass(kw_only=True)
class LoopSection:
    """How long and how to step: precision, clipping, accumulation, evaluation, logging, saving."""

    max_steps: int = 1000
    stop_after: int | None = None  # stop (with a checkpoint) at this step, as if interrupted; resume to max_steps
    max_minutes: float | None = None  # wall-clock budget: stop (with a checkpoint) once it is spent
    init_from: str | None = None  # start from these weights and tokenizer (e.g. masked-LM pre-training); not a resume
    accumulate: int = 1  # micro-batches per optimizer step
    grad_clip: float | None = 1.0  # max global gradient norm; None = no clipping
    label_smoothing: float = 0.0  # the paper used 0.1 for translation (section 5.4)
    precision: str = "fp32"  # fp32 | bf16 (autocast; CPU with AMX, or GPU) | fp16 (with a grad scaler; GPU, or CPU for tests)
    compile: bool = False  # torch.compile the model
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    seed: int = 0
    eval_every: int = 250
    eval_batches: int | None = None  # cap on validation batches; None = the whole split
    eval_bleu: int = 0  # translation: also log val_bleu, greedy BLEU of this many validation sentences; 0 = off
    log_every: int = 10
    save_every: int = 500
    nonfinite: str = "raise"  # raise (stop before the optimizer step) | skip (drop the step)
    progress: bool = True  # a tqdm progress bar on rank 0
    tensorboard: bool = True  # also write TensorBoard events when the package is installed
    retention: RetentionConfig = field(default_factory=lambda: RetentionConfig(keep_last=3, metric="val_loss", mode="min"))
    parallel: str = "ddp"  # under torchrun: ddp (replicate) | fsdp (shard each block, fully_shard; DCP checkpoints)
    cpu_offload: bool = False  # fsdp: keep the sharded parameters and optimizer state in CPU memory
    activation_checkpointing: bool = False  # recompute each block's activations in backward (less memory)

    def __post_init__(self) -> None:
        for name in ("max_steps", "accumulate", "eval_every", "log_every", "save_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"train.{name}={getattr(self, name)} must be >= 1")
        if self.grad_clip is not None and self.grad_clip <= 0:
            raise ValueError(f"train.grad_clip={self.grad_clip} must be > 0 or null")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ValueError(f"train.label_smoothing={self.label_smoothing} must be in [0, 1)")
        if self.stop_after is not None and not 1 <= self.stop_after <= self.max_steps:
            raise ValueError(f"train.stop_after={self.stop_after} must be in [1, max_steps={self.max_steps}] or null")
        if self.max_minutes is not None and self.max_minutes <= 0:
            raise ValueError(f"train.max_minutes={self.max_minutes} must be > 0 or null")
        if self.eval_bleu < 0:
            raise ValueError(f"train.eval_bleu={self.eval_bleu} must be >= 0 (0 = off)")
        if self.eval_batches is not None and self.eval_batches < 1:
            raise ValueError(f"train.eval_batches={self.eval_batches} must be >= 1 or null")
        _choice("train.precision", self.precision, ("fp32", "bf16", "fp16"))
        _choice("train.nonfinite", self.nonfinite, ("raise", "skip"))
        _choice("train.parallel", self.parallel, ("ddp", "fsdp"))
        if self.cpu_offload and self.parallel != "fsdp":
            raise ValueError(f"train.cpu_offload=true needs train.parallel='fsdp', got {self.parallel!r}")


@dataclass(kw_only=True)
class TrainConfig:
    """A whole training run; ``run_dir`` receives checkpoints, metrics and logs."""

    run_dir: str = "runs/default"
    model: ModelSection = field(default_factory=lambda: ModelSection(preset="tiny-decoder-only"))  # type: ignore[call-arg]
    data: DataSection = field(default_factory=DataSection)
    optim: OptimConfig = field(default_factory=OptimConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    train: LoopSection = field(default_factory=LoopSection)

    def __post_init__(self) -> None:
        if self.train.eval_bleu and self.data.task != "translation":
            raise ValueError(f"train.eval_bleu={self.train.eval_bleu} needs data.task='translation', got {self.data.task!r}")
        if self.train.parallel == "fsdp" and self.optim.name == "muon":
            raise ValueError("optim.name='muon' with train.parallel='fsdp': Muon orthogonalises whole matrices, which FSDP shards; use adamw")
        if self.train.retention.metric == "val_bleu" and not self.train.eval_bleu:
            raise ValueError("train.retention.metric='val_bleu' needs train.eval_bleu > 0 (sentences to translate)")


def _choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name}={value!r} must be one of {choices}")
