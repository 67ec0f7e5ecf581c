"""Which Hugging Face classes map onto which family, looked up by exact class name."""

from __future__ import annotations

from aiayn.interop.bart import BART
from aiayn.interop.bert import BERT_ARCHITECTURES
from aiayn.interop.common import Architecture
from aiayn.interop.gpt2 import GPT2_LM_HEAD
from aiayn.interop.gpt_neox import GPT_NEOX_CAUSAL_LM
from aiayn.interop.marian import MARIAN_MT
from aiayn.interop.mbart import MBART
from aiayn.interop.roberta_prelayernorm import ROBERTA_PRELN_ARCHITECTURES

__all__ = ["ARCHITECTURES", "NOT_SUPPORTED", "UnsupportedArchitecture", "architecture"]

ARCHITECTURES: dict[str, Architecture] = {
    a.name: a for a in (GPT2_LM_HEAD, *BERT_ARCHITECTURES.values(), MARIAN_MT, BART, MBART, *ROBERTA_PRELN_ARCHITECTURES.values(), GPT_NEOX_CAUSAL_LM)
}

# Classes people ask for that the core cannot yet represent exactly, and what it lacks.
NOT_SUPPORTED: dict[str, str] = {
    "GPT2Model": "load the GPT2LMHeadModel (the same weights with the tied head) instead",
}


class UnsupportedArchitecture(ValueError):
    """A Hugging Face class with no mapping; the message names it and lists the supported ones."""


def architecture(name: str | None, source: str = "") -> Architecture:
    """The mapping for the class ``name``; raises :class:`UnsupportedArchitecture` listing the supported ones."""
    if name in ARCHITECTURES:
        return ARCHITECTURES[name]
    supported = ", ".join(ARCHITECTURES)
    where = f" ({source})" if source else ""
    if not name:
        raise UnsupportedArchitecture(
            f"no architecture named{where}: config.json has no 'architectures' list; pass architecture= "
            f"(CLI: --architecture) one of the supported: {supported}"
        )
    why = f": {NOT_SUPPORTED[name]}" if name in NOT_SUPPORTED else ""
    raise UnsupportedArchitecture(f"architecture {name!r}{where} is not supported{why}; supported: {supported}")
