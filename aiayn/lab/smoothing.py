"""Lab ``smoothing``: label smoothing hurts perplexity but helps accuracy and BLEU (section 5.4, Table 3).

"This hurts perplexity, as the model learns to be more unsure, but improves accuracy and BLEU
score." Two identical tiny encoder-decoders learn a synthetic translation-like task, one with
``eps = 0`` and one with ``eps = 0.1``; we compare held-out perplexity (no smoothing in the
evaluation), teacher-forced token accuracy and BLEU (sacrebleu) of greedy translations.

The task: source sentences are phrases of a noun, or an adjective then a noun; the translation
maps each word through a dictionary and puts the adjective after its noun (as English to French).
A third of the words have two translations (chosen 70/30 at random), so even a perfect model is
uncertain: perplexity has a floor above 1 and BLEU against the one sampled reference stays below 100.
"""

from __future__ import annotations

import math
import random
import time
from pathlib import Path
from typing import Any

import torch

from aiayn.lab.common import LabResult, held_out_nll, tail_mean, token_accuracy, train, verdict_of
from aiayn.models.config import EncoderDecoderConfig
from aiayn.models.encoder_decoder import EncoderDecoder
from aiayn.tokenization.base import N_SPECIAL
from aiayn.tokenization.special import BOS_ID, EOS_ID, PAD_ID
from aiayn.training.optim import noam_lr

CLAIM = "label smoothing (eps = 0.1) hurts held-out perplexity but improves accuracy and BLEU (paper Table 3)"
N_ADJ, N_NOUN = 8, 16


class Language:
    """The synthetic language pair: word ids, the dictionary and a sentence sampler."""

    def __init__(self, rng: random.Random) -> None:
        first = N_SPECIAL
        self.adjectives = list(range(first, first + N_ADJ))
        self.nouns = list(range(first + N_ADJ, first + N_ADJ + N_NOUN))
        target_first = first + N_ADJ + N_NOUN
        self.vocab_size = target_first + 2 * (N_ADJ + N_NOUN)
        targets = list(range(target_first, self.vocab_size))
        rng.shuffle(targets)
        # each source word: a main translation, and for a third of them a second one
        self.translations = {}
        for i, word in enumerate(self.adjectives + self.nouns):
            main, alt = targets[2 * i], targets[2 * i + 1]
            self.translations[word] = [(main, 0.7), (alt, 0.3)] if i % 3 == 0 else [(main, 1.0)]

    def _word(self, word: int, rng: random.Random) -> int:
        r, acc = rng.random(), 0.0
        for target, p in self.translations[word]:
            acc += p
            if r < acc:
                return target
        return self.translations[word][-1][0]

    def pair(self, rng: random.Random) -> tuple[list[int], list[int]]:
        src, tgt = [], []
        for _ in range(rng.randint(2, 5)):
            noun = rng.choice(self.nouns)
            if rng.random() < 0.5:
                adj = rng.choice(self.adjectives)
                src += [adj, noun]
                tgt += [self._word(noun, rng), self._word(adj, rng)]  # the adjective follows its noun
            else:
                src.append(noun)
                tgt.append(self._word(noun, rng))
        return src, tgt


def _batch(pairs: list[tuple[list[int], list[int]]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pad to ``src (B, S)`` (with EOS), ``tgt_in (B, T)`` = BOS + y and ``tgt_out (B, T)`` = y + EOS."""
    s_len = max(len(s) for s, _ in pairs) + 1
    t_len = max(len(t) for _, t in pairs) + 1
    src = torch.full((len(pairs), s_len), PAD_ID)
    tgt_in = torch.full((len(pairs), t_len), PAD_ID)
    tgt_out = torch.full((len(pairs), t_len), PAD_ID)
    for i, (s, t) in enumerate(pairs):
        src[i, : len(s) + 1] = torch.tensor(s + [EOS_ID])
        tgt_in[i, : len(t) + 1] = torch.tensor([BOS_ID] + t)
        tgt_out[i, : len(t) + 1] = torch.tensor(t + [EOS_ID])
    return src, tgt_in, tgt_out


def _bleu(model: EncoderDecoder, pairs: list[tuple[list[int], list[int]]]) -> float:
    import sacrebleu

    from aiayn.decoding.greedy import greedy

    src, _, _ = _batch(pairs)
    out = greedy(model.eval(), src, max_new_tokens=max(len(t) for _, t in pairs) + 5).tokens.tolist()
    hyps = [" ".join(f"w{i}" for i in (row[: row.index(EOS_ID)] if EOS_ID in row else row) if i != PAD_ID) for row in out]
    refs = [" ".join(f"w{i}" for i in t) for _, t in pairs]
    return float(sacrebleu.corpus_bleu(hyps, [refs]).score)


def run(*, quick: bool = False, out_dir: Path = Path("lab"), seed: int = 0, data_dir: Path | None = None) -> LabResult:
    from aiayn.viz.style import SERIES_COLORS, new_figure, save_figure, style_axes, style_context

    start = time.perf_counter()
    n_train, n_test, steps, d_model, batch_size = (200, 50, 20, 16, 16) if quick else (4000, 500, 1000, 64, 64)
    rng = random.Random(seed)
    lang = Language(rng)
    train_pairs = [lang.pair(rng) for _ in range(n_train)]
    test_pairs = [lang.pair(rng) for _ in range(n_test)]
    test = _batch(test_pairs)
    warmup = max(1, steps // 5)

    def noam(step: int) -> float:
        return noam_lr(step, d_model, warmup)

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    results: dict[str, dict[str, Any]] = {}
    try:
        for eps in (0.0, 0.1):
            torch.manual_seed(seed)
            config = EncoderDecoderConfig(
                vocab_size=lang.vocab_size, n_encoder_layers=2, n_decoder_layers=2, d_model=d_model, n_heads=4,
                d_ff=2 * d_model, dropout=0.1,
            )
            model = EncoderDecoder(config)
            batch_rng = random.Random(seed + 1)
            log = train(model, lambda: _batch(batch_rng.sample(train_pairs, batch_size)), steps=steps, lr_at=noam, smoothing=eps)
            nll = held_out_nll(model, test)
            results[f"eps={eps:g}"] = {
                "eps": eps, "final_train_loss": tail_mean(log.losses), "perplexity": math.exp(nll),
                "accuracy": token_accuracy(model, test), "bleu": _bleu(model, test_pairs), "losses": log.losses, "seconds": log.seconds,
            }
    finally:
        torch.set_num_threads(threads)

    # The floor: the perplexity of the true distribution, from the known 70/30 choices.
    entropy = sum(
        -sum(p * math.log(p) for _, p in lang.translations[w])
        for _, t in test_pairs for w in _source_words(lang, t)
    )
    n_tokens = sum(len(t) + 1 for _, t in test_pairs)
    floor = math.exp(entropy / n_tokens)
    base, smooth = results["eps=0"], results["eps=0.1"]
    hurts_ppl = smooth["perplexity"] > base["perplexity"]
    helps_bleu = smooth["bleu"] > base["bleu"]
    helps_acc = smooth["accuracy"] > base["accuracy"]
    verdict = verdict_of((hurts_ppl, helps_bleu))
    summary = (
        f"held-out ({n_test} sentences) after {steps} steps: perplexity {base['perplexity']:.3f} without vs {smooth['perplexity']:.3f} "
        f"with smoothing (floor of the task {floor:.3f}); token accuracy {base['accuracy']:.1%} vs {smooth['accuracy']:.1%}; "
        f"BLEU {base['bleu']:.2f} vs {smooth['bleu']:.2f}. Smoothing hurts perplexity: {'yes' if hurts_ppl else 'NO'}; "
        f"helps BLEU: {'yes' if helps_bleu else 'NO'}; helps accuracy: {'yes' if helps_acc else 'NO'} "
        "(one seed; differences of a few tenths of a BLEU point are within run-to-run noise)."
    )
    with style_context():
        fig, axes = new_figure(1, 2, width=11, height=4)
        for i, (name, r) in enumerate(results.items()):
            axes[0, 0].plot(range(1, len(r["losses"]) + 1), r["losses"], color=SERIES_COLORS[i], lw=1, label=f"{name} (training loss, smoothed)")
        style_axes(axes[0, 0], title="training", xlabel="step", ylabel="loss", grid=True)
        axes[0, 0].set_yscale("log")
        axes[0, 0].legend()
        names = list(results)
        metrics = (("perplexity", "held-out perplexity"), ("accuracy", "token accuracy"), ("bleu", "BLEU / 100"))
        for j, (key, _) in enumerate(metrics):
            for i, name in enumerate(names):
                value = results[name][key] / (100 if key == "bleu" else 1)
                axes[0, 1].bar(j + (i - 0.5) * 0.35, value, 0.35, color=SERIES_COLORS[i], label=name if j == 0 else None)
                axes[0, 1].text(j + (i - 0.5) * 0.35, value, f"{value:.3f}", ha="center", va="bottom", fontsize=7)
        axes[0, 1].set_xticks(range(len(metrics)))
        axes[0, 1].set_xticklabels([m[1] for m in metrics])
        style_axes(axes[0, 1], title="held-out")
        axes[0, 1].legend()
    plot = save_figure(fig, out_dir / "lab_smoothing.png")
    numbers = {k: {kk: vv for kk, vv in v.items() if kk != "losses"} for k, v in results.items()}
    return LabResult(
        "smoothing", CLAIM, verdict, summary, numbers={**numbers, "perplexity_floor": floor}, plot=plot,
        seconds=time.perf_counter() - start,
        settings={"train_pairs": n_train, "test_pairs": n_test, "steps": steps, "layers": "2+2", "d_model": d_model,
                  "dropout": 0.1, "batch": batch_size, "schedule": f"noam, warmup {warmup}", "threads": 1, "seed": seed},
    )


def _source_words(lang: Language, target: list[int]) -> list[int]:
    """The source word behind each target word (for the entropy floor); every target word has one."""
    back = {t: w for w, options in lang.translations.items() for t, _ in options}
    return [back[t] for t in target]
