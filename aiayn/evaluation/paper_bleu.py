"""The BLEU the paper reported: tokenized, with compound splitting (tensor2tensor's ``get_ende_bleu.sh``).

That script runs the Moses tokenizer (``tokenizer.perl -l de``) over hypotheses and references,
splits hyphenated compounds with ``perl -ple 's{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g'`` (the convention
of GNMT and ConvS2S papers), and scores with ``multi-bleu.perl``: case-sensitive corpus BLEU over
whitespace tokens, no smoothing. Here sacremoses is the Moses tokenizer and sacreBLEU, with its own
tokenization off, is ``multi-bleu``. The result is not comparable to sacreBLEU's detokenized score:
report both (the paper's 27.3 / 28.4 are of this kind).
"""

from __future__ import annotations

import re
from typing import Any, Sequence

import sacrebleu

__all__ = ["PAPER_BLEU_METHOD", "split_compounds", "paper_tokenize", "paper_bleu"]

PAPER_BLEU_METHOD = "Moses tokenizer (sacremoses) + compound splitting ##AT##-##AT## + multi-bleu (tensor2tensor get_ende_bleu.sh)"
_COMPOUND = re.compile(r"(\S)-(\S)")  # Perl's s///g: non-overlapping, so "a-b-c" -> "a ##AT##-##AT## b-c" as there


def split_compounds(line: str) -> str:
    """``rich-text`` -> ``rich ##AT##-##AT## text``, exactly as the Perl one-liner does it."""
    return _COMPOUND.sub(r"\1 ##AT##-##AT## \2", line)


def paper_tokenize(lines: Sequence[str], lang: str = "de") -> list[str]:
    """Moses-tokenize (escaping ``&<>'"|[]`` as ``tokenizer.perl`` does by default), then split compounds."""
    try:
        from sacremoses import MosesTokenizer
    except ImportError as e:  # a dependency of aiayn; a stripped install may lack it
        raise ImportError("the paper's BLEU needs sacremoses (the Moses tokenizer): pip install sacremoses") from e
    moses = MosesTokenizer(lang=lang)
    return [split_compounds(moses.tokenize(line, return_str=True, escape=True)) for line in lines]


def paper_bleu(hypotheses: Sequence[str], references: Sequence[str], *, lang: str = "de") -> dict[str, Any]:
    """Corpus BLEU of detokenized ``hypotheses`` against ``references`` the paper's way, with the method named."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    bleu = sacrebleu.metrics.BLEU(tokenize="none", smooth_method="none", force=True)
    score = bleu.corpus_score(paper_tokenize(hypotheses, lang), [paper_tokenize(references, lang)])
    return {"paper_bleu": round(score.score, 2), "paper_bleu_method": PAPER_BLEU_METHOD}
