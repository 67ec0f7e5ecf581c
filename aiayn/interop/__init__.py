"""Interoperability with Hugging Face ``transformers`` checkpoints: one explicit key-map table per family.

* ``GPT2LMHeadModel`` <-> the decoder-only family (:mod:`aiayn.interop.gpt2`);
* ``BertModel``, ``BertForMaskedLM``, ``BertForSequenceClassification``, ``BertForPreTraining``
  <-> the encoder-only family (:mod:`aiayn.interop.bert`);
* ``MarianMTModel`` and ``BartForConditionalGeneration`` <-> the encoder-decoder family
  (:mod:`aiayn.interop.marian`, :mod:`aiayn.interop.bart`).

Foreign (Hugging Face) names appear only in this package; ``transformers`` is not needed to
convert (only :func:`to_hf_model` imports it). See docs/interop.md.
"""

from aiayn.interop.common import ConfigError
from aiayn.interop.hf import PASSTHROUGH, Exported, Imported, load_hf, save_hf, to_hf, to_hf_model
from aiayn.interop.keymap import KeyMapError
from aiayn.interop.registry import ARCHITECTURES, NOT_SUPPORTED, UnsupportedArchitecture

__all__ = [
    "load_hf", "save_hf", "to_hf", "to_hf_model", "Imported", "Exported", "PASSTHROUGH",
    "ARCHITECTURES", "NOT_SUPPORTED", "UnsupportedArchitecture", "KeyMapError", "ConfigError",
]
