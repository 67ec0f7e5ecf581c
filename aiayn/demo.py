"""The one-command demo: train a small Multi30k translator, score it on test2016, show translations and attention.

Without the data (and no network to fetch it) it says how to get it and runs the copy task instead,
so the command never just fails.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Callable

from aiayn.checkpoint.retention import RetentionConfig
from aiayn.data import DataError, load_multi30k, resolve_files
from aiayn.decoding.beam import BeamConfig
from aiayn.evaluation import evaluate_translation, translate_corpus
from aiayn.pretrained import Pretrained, load_pretrained
from aiayn.training.config import DataSection, LoopSection, ModelSection, TrainConfig
from aiayn.training.loop import train
from aiayn.training.optim import OptimConfig, ScheduleConfig

__all__ = ["demo_config", "run_demo"]

log = logging.getLogger(__name__)


def demo_config(run_dir: str | Path, *, data_dir: str | None, minutes: float) -> TrainConfig:
    """A small version of the multi30k-de-en recipe that trains within ``minutes`` on a 2-core CPU."""
    return TrainConfig(
        run_dir=str(run_dir),
        # Pre-LN, as in the multi30k-de-en recipe: it tolerates the short warmup a 9-minute budget leaves.
        model=ModelSection(family="encoder-decoder", n_encoder_layers=3, n_decoder_layers=3, d_model=256, n_heads=4,
                           d_ff=1024, dropout=0.1, max_len=256, norm_position="pre"),
        data=DataSection(task="translation", dataset="multi30k", direction="de-en", data_dir=data_dir, tokenizer="bpe",
                         vocab_size=8000, max_len=128, max_tokens=4096),
        optim=OptimConfig(name="adam", lr=1.0, betas=(0.9, 0.98), eps=1e-9),
        schedule=ScheduleConfig(name="noam", d_model=256, warmup=200, factor=0.5),  # peak lr 2.2e-3 at step 200
        train=LoopSection(max_steps=2000, max_minutes=minutes, label_smoothing=0.1, grad_clip=None, precision="bf16",
                          eval_every=250, save_every=250, log_every=25, retention=RetentionConfig(keep_last=2, metric="val_loss")),
    )


def run_demo(
    *, run_dir: str | Path = "runs/demo", data_dir: str | None = None, minutes: float = 9.0,
    fallback: Callable[[], int] | None = None, say: Callable[[str], None] = print,
) -> int:
    """Train (or resume), then print test2016 BLEU, three translations and where the attention picture is."""
    try:
        resolve_files("multi30k", "train", data_dir=data_dir)
        resolve_files("multi30k", "test2016", data_dir=data_dir)
    except DataError as e:
        say(f"Multi30k is not available here:\n{e}\n")
        if fallback is None:
            return 1
        say("Running the copy task instead (no data needed).\n")
        return fallback()
    config = demo_config(run_dir, data_dir=data_dir, minutes=minutes)
    layers = config.model.overrides
    say(f"training a {layers['n_encoder_layers']}+{layers['n_decoder_layers']}-layer encoder-decoder on Multi30k "
        f"German->English for at most {minutes:g} minutes (checkpoints in {run_dir})...")
    result = train(config)
    say(f"trained {result.step} steps; validation loss {result.metrics.get('val_loss', float('nan')):.3f}")
    loaded = load_pretrained(run_dir)
    test = load_multi30k("test2016", direction="de-en", data_dir=data_dir)
    beam = BeamConfig(**loaded.decode.beam())
    say(f"translating the {len(test.src)} sentences of test2016 with beam search (beam {beam.beam_size}, alpha {beam.length_penalty})...")
    hyps = translate_corpus(loaded.model, loaded.src_tokenizer, loaded.tgt_tokenizer, test.src, beam=beam)  # type: ignore[arg-type]
    scores = evaluate_translation(hyps, test.tgt)
    say(f"\nsacreBLEU on test2016 (de->en): {scores['bleu']}  chrF: {scores['chrf']}")
    say(f"  {scores['bleu_signature']}")
    for i in (0, 1, 2):
        say(f"\n  source    {test.src[i]}\n  output    {hyps[i]}\n  reference {test.tgt[i]}")
    picture = _attention_picture(loaded, test.src[0], hyps[0], Path(run_dir))  # the beam output printed above
    say(f"\ncross-attention of every layer and head for the first sentence: {picture}")
    return 0


def _attention_picture(loaded: Pretrained, sentence: str, translation: str, out_dir: Path) -> Path:
    from aiayn.viz.attention import collect_attention, plot_attention_grid

    assert loaded.src_tokenizer is not None  # translate_corpus above needed it
    views, _ = collect_attention(loaded.model, loaded.src_tokenizer, sentence, target=translation, tgt_tokenizer=loaded.tgt_tokenizer)
    cross = next(v for v in views if v.name == "decoder_cross")
    return plot_attention_grid(cross, out_dir / "attention_cross.png", title=f"cross-attention: {sentence}")
