"""train.eval_bleu: greedy BLEU on validation sentences, logged as val_bleu and usable for retention."""

from __future__ import annotations

import pytest
from loop_fixtures import lm_config, translation_config

from aiayn.checkpoint.retention import RetentionConfig
from aiayn.decoding.beam import BeamConfig
from aiayn.evaluation import during_training
from aiayn.evaluation.during_training import bleu_eval_hook
from aiayn.evaluation.metrics import evaluate_translation, translate_corpus
from aiayn.training.config import LoopSection, TrainConfig
from aiayn.training.loop import train
from aiayn.training.metrics_log import read_metrics


def test_val_bleu_scores_greedy_translations_against_the_validation_references(tmp_path, monkeypatch):
    config = translation_config(tmp_path, steps=12, dropout=0.0, eval_bleu=1000)
    scored = []
    monkeypatch.setattr(during_training, "evaluate_translation",
                        lambda hyps, refs: scored.append((list(hyps), list(refs))) or evaluate_translation(hyps, refs))
    result = train(config)
    logged = [r["val_bleu"] for r in read_metrics(result.run_dir) if "val_bleu" in r]
    assert len(logged) == len(scored) == 3  # steps 4, 8, 12
    sources = (tmp_path / "data" / "src.txt").read_text().splitlines()
    references = (tmp_path / "data" / "tgt.txt").read_text().splitlines()
    # Beam search with one beam and no length penalty is greedy: all 120 sentences, in file order.
    data = result.data
    hypotheses = translate_corpus(result.model, data.src_tokenizer, data.tgt_tokenizer, sources,
                                  beam=BeamConfig(beam_size=1, length_penalty=0.0))
    hyps, refs = scored[-1]
    assert sorted(zip(refs, hyps)) == sorted(zip(references, hypotheses))  # same pairs, batch order aside
    assert len(set(hyps)) > 1  # the model says different things for different sources
    assert logged[-1] == evaluate_translation(hypotheses, references)["bleu"]


def test_hook_restores_training_mode_and_respects_the_sentence_cap(tmp_path):
    result = train(translation_config(tmp_path, steps=2))
    result.model.train()
    hook = bleu_eval_hook(5)
    seen = []
    original = result.data.tgt_tokenizer.decode
    result.data.tgt_tokenizer.decode = lambda ids: seen.append(1) or original(ids)
    value = hook(result.model, result.data, 2)["val_bleu"]
    assert 0.0 <= value <= 100.0
    assert len(seen) == 10  # 5 hypotheses + 5 references
    assert result.model.training


def test_bad_settings_are_refused_up_front(tmp_path):
    with pytest.raises(ValueError, match=r"train.eval_bleu=-1 must be >= 0"):
        LoopSection(eval_bleu=-1)
    lm = lm_config(tmp_path)
    with pytest.raises(ValueError, match=r"train.eval_bleu=10 needs data.task='translation', got 'lm'"):
        TrainConfig(run_dir=lm.run_dir, model=lm.model, data=lm.data, train=LoopSection(eval_bleu=10))
    tr = translation_config(tmp_path)
    with pytest.raises(ValueError, match=r"retention.metric='val_bleu' needs train.eval_bleu > 0"):
        TrainConfig(run_dir=tr.run_dir, model=tr.model, data=tr.data,
                    train=LoopSection(retention=RetentionConfig(keep_last=2, metric="val_bleu", mode="max")))
    with pytest.raises(ValueError, match="sentences=0 must be >= 1"):
        bleu_eval_hook(0)
