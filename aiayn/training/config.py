"""The training config: typed sections that map one-to-one onto a YAML file, with dotted overrides.

``aiayn train recipe.yaml --set optim.lr=5e-4 --set model.n_layers=4``; ``aiayn recipes`` lists the packaged examples (``aiayn/recipes/``).
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from aiayn.checkpoint.retention import RetentionConfig
from aiayn.config_io import convert_value
from aiayn.data.batching import check_pad_multiple
from aiayn.models.config import FAMILIES, TransformerConfig, config_from_dict
from aiayn.models.presets import preset
from aiayn.training.optim import OptimConfig, ScheduleConfig
from aiayn.training.precision import PRECISIONS
from aiayn.validation import check_choice, check_int, check_known_keys, check_number, is_int, rule

__all__ = ["ModelSection", "DataSection", "LoopSection", "DecodeSection", "TrainConfig", "build_model_config", "TASKS", "DATASET_NAMES"]

TASKS = ("translation", "lm", "mlm", "classification")
DATASET_NAMES = ("multi30k", "tinyshakespeare", "sst2", "files", "wmt14-en-de")


_SECTION_KEYS = ("preset", "family")
AUTO = "auto"  # model.n_classes: auto = the number of labels in the training file


def _model_fields() -> dict[str, Any]:
    """Every model-config field of every family, in a stable order, with its annotation."""
    hints: dict[str, Any] = {}
    for cls in FAMILIES.values():
        types = typing.get_type_hints(cls)
        hints.update((f.name, types[f.name]) for f in dataclasses.fields(cls) if f.name not in hints)
    return hints


class ModelSection:
    """The model: a ``preset`` (or a ``family`` built from its defaults) plus the fields to change.

    A field that is absent keeps the preset's value; a field given as ``None`` (YAML ``null``) is set
    to ``None`` (``pad_id: null`` means "no padding token"). The changes are checked by building the
    config at once, with the config's own ``replace`` (a field unknown to the family, or a bad value,
    fails here, before any work). ``vocab_size`` defaults to the tokenizer's; ``n_classes: auto`` (or
    absent) takes the number of labels in the training file.
    In YAML the section is flat: ``model: {preset: tiny-decoder-only, d_model: 64, pad_id: null}``.
    """

    def __init__(self, *, preset: str | None = None, family: str | None = None, **overrides: Any) -> None:
        if preset is not None and family is not None:
            raise ValueError(f"model: give one of model.preset or model.family (e.g. model.preset=tiny-decoder-only), "
                             f"not both: got preset={preset!r}, family={family!r}")
        check_known_keys(overrides, [*_SECTION_KEYS, *_model_fields()], owner="ModelSection", path="model")
        self.preset, self.family, self.overrides = preset, family, dict(overrides)
        if self.from_checkpoint:
            return  # the fields go over train.init_from's config, which the run reads (TrainConfig checks it is set)
        self.build(vocab_size=self.overrides.get("vocab_size") or 32_000)  # validate now (any vocabulary will do)

    @property
    def from_checkpoint(self) -> bool:
        """Neither preset nor family: the model is train.init_from's, with these fields over it."""
        return self.preset is None and self.family is None

    @property
    def classes_from_data(self) -> bool:
        """``n_classes`` is absent or ``auto``: the training labels decide it."""
        return self.overrides.get("n_classes", AUTO) in (AUTO, None)

    def fixed_overrides(self) -> dict[str, Any]:
        """The fields the section sets, without an ``n_classes: auto`` (which the data fills in)."""
        return {k: v for k, v in self.overrides.items() if not (k == "n_classes" and v == AUTO)}

    def build(self, *, vocab_size: int | None = None) -> TransformerConfig:
        """The model config; ``vocab_size`` fills in when the section does not set it."""
        if self.from_checkpoint:
            raise ValueError("model: give model.preset or model.family (or train.init_from, whose model this section changes)")
        values = self.fixed_overrides()
        if vocab_size is not None and values.get("vocab_size") is None:
            values["vocab_size"] = vocab_size
        if self.preset is not None:
            return preset(self.preset, **values)
        return config_from_dict({"family": self.family, **values})

    def replace(self, **changes: Any) -> ModelSection:
        """A copy with some fields set (or, with ``preset=`` / ``family=``, another base), validated again."""
        head = {"preset": self.preset, "family": self.family}
        if "preset" in changes or "family" in changes:
            head = {"preset": changes.pop("preset", None), "family": changes.pop("family", None)}
        return ModelSection(**head, **(self.overrides | changes))

    def to_plain(self) -> dict[str, Any]:
        """The flat YAML form: ``preset`` or ``family``, then the overrides as given."""
        head = {"preset": self.preset} if self.preset is not None else {"family": self.family} if self.family is not None else {}
        return head | self.overrides

    @classmethod
    def from_plain(cls, data: Mapping[str, Any], path: str = "model") -> ModelSection:
        """The section from its flat YAML form (see :meth:`to_plain`); errors name ``path``."""
        if not isinstance(data, Mapping):
            raise TypeError(f"{path}: expected a mapping of model fields, got {type(data).__name__}")
        values = dict(data)
        if all(key in values for key in _SECTION_KEYS):
            # The form saved before null meant None: every field written, None for "unset" (train_config.yaml
            # of older runs). Read it as it was trained: its None values are the preset's.
            values = {k: v for k, v in values.items() if v is not None}
        head = {key: values.pop(key, None) for key in _SECTION_KEYS}
        hints = _model_fields()
        for key, value in values.items():
            if key == "n_classes" and value in (AUTO, None):
                if value is None:
                    raise ValueError(f"{path}.n_classes: expected a number of classes or auto (one class per label "
                                     "of the training file), got null")
                continue
            if key in hints:  # unknown keys: the constructor names them
                values[key] = convert_value(value, hints[key], f"{path}.{key}")
        return cls(**head, **values)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ModelSection) and self.to_plain() == other.to_plain()

    def __repr__(self) -> str:
        return f"ModelSection({', '.join(f'{k}={v!r}' for k, v in self.to_plain().items())})"


def build_model_config(section: ModelSection, *, vocab_size: int | None = None) -> TransformerConfig:
    """The model config a ``ModelSection`` describes; ``vocab_size`` fills in when the section has none."""
    return section.build(vocab_size=vocab_size)


@dataclass(kw_only=True)
class DataSection:
    """What to train on and how to batch it."""

    task: str = "lm"  # translation | lm (language modelling) | mlm (masked LM) | classification
    dataset: str = "tinyshakespeare"  # a named data set, or "files" with the paths below
    data_dir: str | None = None  # else $AIAYN_DATA_DIR, else the user cache (see docs/data.md)
    direction: str = "de-en"  # multi30k: source-target
    train_files: list[str] = field(default_factory=list)  # dataset=files: [src, tgt] | [pairs] | [text] | [table] (docs/data.md)
    val_files: list[str] = field(default_factory=list)  # none: 10% of train_files is held out (docs/own-data.md)
    test_files: list[str] = field(default_factory=list)  # `aiayn evaluate --split test` scores them
    text_column: str | int | None = None  # tables: by name or number (0 = first); default text/sentence, or column 1
    label_column: str | int | None = None  # tables: default label, or column 0
    source_column: str | int | None = None  # translation, one table of pairs: default source/src, or column 0
    target_column: str | int | None = None  # default target/tgt, or column 1
    header: bool | Literal["auto"] = "auto"  # tables: true | false | auto (the first row is a header if it names a column)
    tokenizer: Literal["bpe", "char"] = "bpe"
    vocab_size: int = 8000  # BPE vocabulary (ignored by char)
    shared_vocab: bool = True  # one vocabulary for source and target (the paper)
    max_len: int = 256  # longest sequence kept; longer ones are dropped or truncated
    too_long: Literal["drop", "truncate", "error"] = "drop"
    max_tokens: int = 4096  # translation: token budget per batch and side (paper: 25000)
    batch_size: int = 32  # lm: windows per batch; mlm / classification: sentences per batch
    block_size: int = 64  # lm: context length
    num_workers: int = 0
    pad_to_multiple: int = 1  # translation / mlm / classification: round batch lengths up to this (8, 16: few shapes recur)
    prepared: str | None = None  # translation: a directory written by `aiayn prepare`: train on its token-id shards

    def batch_tokens(self) -> int:
        """About how many tokens a batch holds: the rows each Linear layer multiplies at once."""
        if self.task == "translation":
            return self.max_tokens
        return self.batch_size * (self.block_size if self.task == "lm" else self.max_len)

    def __post_init__(self) -> None:
        check_pad_multiple(self.pad_to_multiple, "data.pad_to_multiple")
        check_choice("data.task", self.task, TASKS)
        check_choice("data.dataset", self.dataset, DATASET_NAMES)
        check_choice("data.tokenizer", self.tokenizer, ("bpe", "char"))
        check_choice("data.too_long", self.too_long, ("drop", "truncate", "error"))
        check_choice("data.direction", self.direction, ("de-en", "en-de"))
        for name in ("vocab_size", "max_len", "max_tokens", "batch_size", "block_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"data.{name}={getattr(self, name)} must be >= 1")
        if self.num_workers < 0:
            raise ValueError(f"data.num_workers={self.num_workers} must be >= 0")
        if self.dataset == "files" and not self.train_files and self.prepared is None:
            raise ValueError("data.train_files is required when data.dataset=files")
        if self.prepared is not None and self.task != "translation":
            raise ValueError(f"data.prepared={self.prepared!r} holds sentence pairs: it needs data.task='translation', got {self.task!r}")


@dataclass(kw_only=True)
class LoopSection:
    """How long and how to step: precision, clipping, accumulation, evaluation, logging, saving."""

    max_steps: int = 1000
    stop_after: int | None = None  # stop (with a checkpoint) at this step, as if interrupted; resume to max_steps
    max_minutes: float | None = None  # wall-clock budget: stop (with a checkpoint) once it is spent
    init_from: str | None = None  # start from these weights and tokenizer (e.g. masked-LM pre-training); not a resume
    accumulate: int = 1  # micro-batches per optimizer step
    micro_batches_per_step: int | None = None  # of all ranks together: each rank accumulates this / world size (the paper's batch on any GPU count)
    grad_clip: float | None = 1.0  # max global gradient norm; None = no clipping
    label_smoothing: float = 0.0  # the paper used 0.1 for translation (section 5.4)
    precision: str = "fp32"  # fp32 | bf16 (autocast; CPU with AMX, or GPU) | fp16 (with a grad scaler; GPU, or CPU for tests) | bf16-master (bf16 weights, fp32 masters; docs/training.md) | auto (bf16 where native); float32, bfloat16, float16 alike
    compile: bool = False  # torch.compile the model
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    seed: int = 0
    eval_every: int = 250
    eval_batches: int | None = None  # cap on validation batches; None = the whole split
    eval_bleu: int = 0  # translation: also log val_bleu, greedy BLEU of this many validation sentences; 0 = off
    log_every: int = 10
    save_every: int = 500
    save_every_minutes: float | None = None  # also checkpoint once this much time has passed since the last save (the paper: 10)
    nonfinite: str = "raise"  # raise (stop before the optimizer step) | skip (drop the step)
    progress: bool = True  # a tqdm progress bar on rank 0
    tensorboard: bool = True  # also write TensorBoard events when the package is installed
    retention: RetentionConfig = field(default_factory=RetentionConfig)  # the last 3 and the best by val_loss
    parallel: str = "ddp"  # under torchrun: ddp (replicate) | fsdp (shard each block, fully_shard; DCP checkpoints)
    cpu_offload: bool = False  # fsdp: keep the sharded parameters and optimizer state in CPU memory
    activation_checkpointing: bool = False  # recompute each block's activations in backward (less memory)
    hold_freed_steps: int = 10  # mimalloc keeps freed memory this many steps' time (0: its own second; docs/training.md)
    onednn_cache_capacity: int | None = None  # oneDNN keeps at most this many compiled primitives (less memory with many batch shapes); None = its 1,024
    malloc_mmap_threshold: int | None = None  # glibc: a fixed mmap threshold in bytes (65536: less peak RSS, half the speed on an AMX Xeon; docs/benchmarks.md); None = glibc's own

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
        if self.save_every_minutes is not None and self.save_every_minutes <= 0:
            raise ValueError(f"train.save_every_minutes={self.save_every_minutes} must be > 0 or null")
        if self.micro_batches_per_step is not None and self.micro_batches_per_step < 1:
            raise ValueError(f"train.micro_batches_per_step={self.micro_batches_per_step} must be >= 1 or null")
        if self.eval_batches is not None and self.eval_batches < 1:
            raise ValueError(f"train.eval_batches={self.eval_batches} must be >= 1 or null")
        check_choice("train.precision", self.precision, PRECISIONS)
        check_choice("train.nonfinite", self.nonfinite, ("raise", "skip"))
        check_choice("train.parallel", self.parallel, ("ddp", "fsdp"))
        rule(is_int(self.hold_freed_steps) and 0 <= self.hold_freed_steps <= 1000,
             "train.hold_freed_steps", self.hold_freed_steps, "must be an int in [0, 1000] (0: the allocator's own delay)")
        if self.onednn_cache_capacity is not None:
            rule(is_int(self.onednn_cache_capacity) and 0 <= self.onednn_cache_capacity <= 2**20, "train.onednn_cache_capacity",
                 self.onednn_cache_capacity, "must be an int in [0, 1048576] (0: no cache) or null (oneDNN's 1,024)")
        if self.malloc_mmap_threshold is not None:
            rule(is_int(self.malloc_mmap_threshold) and 0 < self.malloc_mmap_threshold <= 32 * 2**20,
                 "train.malloc_mmap_threshold", self.malloc_mmap_threshold, "must be an int in [1, 33554432] (glibc's maximum) or null")
        if self.cpu_offload and self.parallel != "fsdp":
            raise ValueError(f"train.cpu_offload=true needs train.parallel='fsdp', got {self.parallel!r}")

    def micro_batches(self, world_size: int) -> int:
        """Micro-batches each rank accumulates per step: ``micro_batches_per_step / world_size``, else ``accumulate``."""
        if self.micro_batches_per_step is None:
            return self.accumulate
        if self.micro_batches_per_step % world_size:
            raise ValueError(
                f"train.micro_batches_per_step={self.micro_batches_per_step} is not a multiple of the {world_size} ranks: "
                f"set it to a multiple of {world_size} (and data.max_tokens so that their product stays the batch you want)"
            )
        return self.micro_batches_per_step // world_size


@dataclass(kw_only=True)
class DecodeSection:
    """How the trained model translates unless told otherwise (``aiayn evaluate``, ``aiayn translate``,
    ``aiayn.load(...).translate``, the server): beam search's size and length penalty alpha, chosen on ``val``.
    The paper's 4 and 0.6 (section 6.1, chosen on its development set) by default. It is saved with the model."""

    beam_size: int = 4
    length_penalty: float = 0.6  # GNMT's alpha: a hypothesis scores log P / ((5 + length) / 6) ** alpha

    def __post_init__(self) -> None:
        check_int("decode.beam_size", self.beam_size, minimum=1)
        check_number("decode.length_penalty", self.length_penalty, minimum=0.0, inclusive=True)

    def beam(self, beam_size: int | None = None, length_penalty: float | None = None) -> dict[str, Any]:
        """``beam_size`` and ``length_penalty`` for a beam search: those given (a flag, an argument, a request's
        field), else this section's."""
        return {"beam_size": self.beam_size if beam_size is None else beam_size,
                "length_penalty": self.length_penalty if length_penalty is None else length_penalty}


@dataclass(kw_only=True)
class TrainConfig:
    """A whole training run; ``run_dir`` receives checkpoints, metrics and logs."""

    run_dir: str = "runs/default"
    model: ModelSection = field(default_factory=lambda: ModelSection(preset="tiny-decoder-only"))
    data: DataSection = field(default_factory=DataSection)
    optim: OptimConfig = field(default_factory=OptimConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    train: LoopSection = field(default_factory=LoopSection)
    decode: DecodeSection = field(default_factory=DecodeSection)

    def __post_init__(self) -> None:
        if self.model.from_checkpoint and not self.train.init_from:
            raise ValueError("model: give model.preset or model.family (e.g. model.preset=tiny-decoder-only), "
                             "or train.init_from=DIR to start from that model (the section's fields then change it)")
        if self.train.eval_bleu and self.data.task != "translation":
            raise ValueError(f"train.eval_bleu={self.train.eval_bleu} needs data.task='translation', got {self.data.task!r}")
        if self.train.parallel == "fsdp" and self.optim.name == "muon":
            raise ValueError("optim.name='muon' with train.parallel='fsdp': Muon orthogonalises whole matrices, which FSDP shards; use adamw")
        if self.train.retention.metric == "val_bleu" and not self.train.eval_bleu:
            raise ValueError("train.retention.metric='val_bleu' needs train.eval_bleu > 0 (sentences to translate)")
        if self.decode != DecodeSection() and self.data.task != "translation":
            raise ValueError(f"decode: beam search settings apply to translation, got data.task={self.data.task!r}")
