"""The paper's tokenized BLEU with compound splitting (tensor2tensor's get_ende_bleu.sh), against a hand count."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import sacrebleu

from aiayn.evaluation.paper_bleu import paper_bleu, paper_tokenize, split_compounds


def test_compound_splitting_is_the_perl_one_liners():
    assert split_compounds("rich-text format") == "rich ##AT##-##AT## text format"
    assert split_compounds("a-b-c") == "a ##AT##-##AT## b-c"  # s///g does not overlap its matches
    assert split_compounds("- x - y -z") == "- x - y -z"  # a dash needs a non-space on both sides
    assert paper_tokenize(['Er sagte: "Bundes-Regierung & Co."']) == [
        "Er sagte : &quot; Bundes ##AT##-##AT## Regierung &amp; Co. &quot;"  # "Co." is a German non-breaking prefix
    ]


def test_paper_bleu_of_a_fixed_example_equals_the_hand_computed_value():
    hypothesis = "Die Bundes-Regierung hat es gesagt."
    reference = "Die Bundes-Regierung hat das gesagt."
    # Tokenized and split, both have 8 tokens: Die Bundes ##AT##-##AT## Regierung hat {es|das} gesagt .
    # Matches: unigrams 7/8, bigrams 5/7, trigrams 3/6, 4-grams 2/5; equal lengths, so no brevity penalty.
    hand = 100 * math.exp((math.log(7 / 8) + math.log(5 / 7) + math.log(3 / 6) + math.log(2 / 5)) / 4)
    assert hand == pytest.approx(100 * 2 ** -0.75)  # the product of the precisions is 1/8
    result = paper_bleu([hypothesis], [reference])
    assert result["paper_bleu"] == round(hand, 2) == 59.46
    # sacreBLEU keeps the compound whole (13a): one token fewer, and a different score
    assert sacrebleu.corpus_bleu([hypothesis], [[reference]]).score == pytest.approx(37.99, abs=0.01)


def test_paper_bleu_needs_one_reference_per_hypothesis():
    with pytest.raises(ValueError, match="2 hypotheses but 1 references"):
        paper_bleu(["a", "b"], ["a"])


SHARED_DATA = Path(__file__).resolve().parents[2] / ".." / "shared" / "data"


@pytest.mark.data
@pytest.mark.skipif(not (SHARED_DATA / "multi30k").is_dir(), reason="needs the real data sets in ../shared/data")
def test_evaluation_into_german_reports_the_paper_bleu_beside_sacrebleu():
    from aiayn.evaluation.held_out import evaluate_held_out
    from aiayn.models.presets import build_model
    from aiayn.tokenization import BPETokenizer
    from aiayn.training.config import DataSection

    tok = BPETokenizer.train(["ein Hund läuft", "a dog runs"] * 20, 300)
    model = build_model("tiny-encoder-decoder", vocab_size=tok.vocab_size)
    into_german = DataSection(task="translation", dataset="multi30k", direction="en-de", data_dir=str(SHARED_DATA))
    metrics = evaluate_held_out(model, tok, tok, into_german, "val", limit=2).metrics
    assert {"bleu", "bleu_signature", "paper_bleu", "paper_bleu_method"} <= set(metrics)
    into_english = DataSection(task="translation", dataset="multi30k", direction="de-en", data_dir=str(SHARED_DATA))
    assert "paper_bleu" not in evaluate_held_out(model, tok, tok, into_english, "val", limit=2).metrics
