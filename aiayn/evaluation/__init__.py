"""Evaluation on held-out data: BLEU/chrF for translation, perplexity for LMs, accuracy for classifiers."""

from aiayn.evaluation.metrics import evaluate_classifier, evaluate_lm, evaluate_translation, translate_corpus

__all__ = ["translate_corpus", "evaluate_translation", "evaluate_lm", "evaluate_classifier"]
