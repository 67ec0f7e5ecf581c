"""Small on-disk data sets and configs for the training-loop tests (no real data needed)."""

from __future__ import annotations

import random
from pathlib import Path

from aiayn.config_io import save_yaml
from aiayn.training.config import DataSection, LoopSection, ModelSection, TrainConfig
from aiayn.training.optim import OptimConfig, ScheduleConfig

WORDS = "the a cat dog sat ran on under mat tree big small red blue".split()


def write_parallel(directory: Path, n: int = 120, seed: int = 0) -> tuple[Path, Path]:
    """A toy translation corpus: the target is the source reversed and upper-cased."""
    rng = random.Random(seed)
    src, tgt = [], []
    for _ in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.randint(2, 7))]
        src.append(" ".join(words))
        tgt.append(" ".join(reversed(words)).upper())
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "src.txt").write_text("\n".join(src) + "\n")
    (directory / "tgt.txt").write_text("\n".join(tgt) + "\n")
    return directory / "src.txt", directory / "tgt.txt"


def write_text(directory: Path, n_chars: int = 6000, seed: int = 0) -> Path:
    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    text = " ".join(rng.choice(WORDS) for _ in range(n_chars // 4))
    (directory / "text.txt").write_text(text)
    return directory / "text.txt"


def translation_config(tmp: Path, *, steps: int = 8, dropout: float = 0.1, **loop: object) -> TrainConfig:
    src, tgt = write_parallel(tmp / "data")
    loop_kw = dict(max_steps=steps, eval_every=4, save_every=2, log_every=1, progress=False, tensorboard=False)
    loop_kw.update(loop)
    return TrainConfig(
        run_dir=str(tmp / "run"),
        model=ModelSection(preset="tiny-encoder-decoder", dropout=dropout, d_model=16, d_ff=32, n_heads=2),
        data=DataSection(task="translation", dataset="files", train_files=[str(src), str(tgt)],
                         val_files=[str(src), str(tgt)], tokenizer="char", max_tokens=160),
        optim=OptimConfig(name="adam", lr=1.0),
        schedule=ScheduleConfig(name="noam", warmup=4, d_model=16),
        train=LoopSection(**loop_kw),
    )


def lm_config(tmp: Path, *, steps: int = 6, **loop: object) -> TrainConfig:
    text = write_text(tmp / "data")
    loop_kw = dict(max_steps=steps, eval_every=3, save_every=3, log_every=1, progress=False, tensorboard=False, grad_clip=1.0)
    loop_kw.update(loop)
    return TrainConfig(
        run_dir=str(tmp / "run"),
        model=ModelSection(preset="tiny-decoder-only", dropout=0.0, max_len=16),
        data=DataSection(task="lm", dataset="files", train_files=[str(text)], tokenizer="char", block_size=16, batch_size=4),
        optim=OptimConfig(name="adamw", lr=3e-3, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1),
        schedule=ScheduleConfig(name="constant", warmup=0),
        train=LoopSection(**loop_kw),
    )


def save_config(config: TrainConfig, path: Path) -> Path:
    save_yaml(config, path)
    return path
