"""The model variants of the conformance matrix, each saved once per session as a model directory.

Ours: the three families with each position kind, the attention kinds (softmax, local, linear, the
SSM mixer) where the family takes them, and grouped-query attention, on tiny sizes (d_model 16,
one or two layers, a character vocabulary of ~30). Hugging Face's: tiny GPT-2, BERT, Marian and BART
directories with their REAL special ids and tokenizers (built by :mod:`pretrained_dirs` of
``tests/interop``), so no entry point can get away with this library's fixed ids.

``variant_dir(name)`` builds a directory on first use (in a temporary folder removed at exit) and
returns it afterwards; :data:`VARIANTS` names them all with their family.
"""

from __future__ import annotations

import atexit
import json
import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "interop"))  # the tiny HF builders, not copied

from aiayn import build_model  # noqa: E402
from aiayn.pretrained import LABELS_FILE, save_pretrained  # noqa: E402
from aiayn.tokenization import CharTokenizer  # noqa: E402

TEXT = "the cat sat on a mat. ein hund lief im park."
PROMPT = "the ca"  # a prompt every variant's tokenizer reads
SOURCE = "ein hund"
SIZES = {"d_model": 16, "n_heads": 2, "d_ff": 32, "dropout": 0.0}
LM_CONTEXT = 24  # learned positions: short, so that generation goes past it


@dataclass(frozen=True)
class Variant:
    """``family`` of the model, ``hf`` for a Hugging Face directory, and the ``settings`` it is built with."""

    family: str
    settings: dict = field(default_factory=dict)
    hf: str | None = None

    @property
    def setting(self) -> str:
        """The settings as ``key=value`` text (the support table's row label)."""
        return ", ".join(f"{k}={v}" for k, v in self.settings.items()) or f"Hugging Face {self.hf}"


_LM = "decoder-only"
VARIANTS: dict[str, Variant] = {
    "lm-learned": Variant(_LM, {"positions": "learned", "max_len": LM_CONTEXT}),
    "lm-sinusoidal": Variant(_LM, {"positions": "sinusoidal"}),
    "lm-rotary": Variant(_LM, {"positions": "rotary"}),
    "lm-alibi": Variant(_LM, {"positions": "alibi"}),
    "lm-gqa": Variant(_LM, {"positions": "rotary", "n_kv_heads": 1}),
    "lm-local": Variant(_LM, {"positions": "rotary", "attention": "local", "window": 4}),
    "lm-linear": Variant(_LM, {"positions": "rotary", "attention": "linear"}),
    "lm-ssm": Variant(_LM, {"positions": "none", "mixer": "ssm", "ssm_state": 4}),
    "s2s-sinusoidal": Variant("encoder-decoder", {"positions": "sinusoidal"}),
    "s2s-learned": Variant("encoder-decoder", {"positions": "learned", "max_len": 64}),
    "s2s-rotary-gqa": Variant("encoder-decoder", {"positions": "rotary", "n_kv_heads": 1}),
    "enc-learned": Variant("encoder-only", {"positions": "learned", "max_len": 64}),
    "enc-alibi": Variant("encoder-only", {"positions": "alibi"}),
    "enc-local": Variant("encoder-only", {"positions": "rotary", "attention": "local", "window": 4}),
    "hf-gpt2": Variant(_LM, hf="gpt2"),
    "hf-bert": Variant("encoder-only", hf="bert"),
    "hf-bert-classifier": Variant("encoder-only", hf="bert-classifier"),
    "hf-marian": Variant("encoder-decoder", hf="marian"),
    "hf-bart": Variant("encoder-decoder", hf="bart"),
}
LABELS = ["negative", "positive"]

_ROOT: Path | None = None
_BUILT: dict[str, Path] = {}


def variant_dir(name: str) -> Path:
    """The model directory of variant ``name``, built on first use."""
    global _ROOT
    if name not in VARIANTS:
        raise KeyError(f"unknown variant {name!r}; known: {sorted(VARIANTS)}")
    if name not in _BUILT:
        if _ROOT is None:
            _ROOT = Path(tempfile.mkdtemp(prefix="aiayn-variants-"))
            atexit.register(shutil.rmtree, _ROOT, ignore_errors=True)
        variant = VARIANTS[name]
        build = _HF[variant.hf] if variant.hf else _ours
        _BUILT[name] = build(_ROOT / name, variant)
    return _BUILT[name]


def _ours(path: Path, variant: Variant) -> Path:
    tok = CharTokenizer.train([TEXT])
    preset = {"decoder-only": "tiny-decoder-only", "encoder-decoder": "tiny-encoder-decoder", "encoder-only": "tiny-encoder-only"}
    layers = {"decoder-only": {"n_layers": 2}, "encoder-decoder": {"n_encoder_layers": 1, "n_decoder_layers": 1},
              "encoder-only": {"n_layers": 1, "n_classes": len(LABELS)}}[variant.family]
    torch.manual_seed(0)
    model = build_model(preset[variant.family], vocab_size=tok.vocab_size, **SIZES, **layers, **variant.settings).eval()
    save_pretrained(path, model, tok)
    if variant.family == "encoder-only":
        (path / LABELS_FILE).write_text(json.dumps({"labels": LABELS}), encoding="utf-8")
    return path


def _bart_dir(path: Path, variant: Variant) -> Path:
    """BART's layout (``<s>`` 0, ``<pad>`` 1, ``</s>`` 2, sources ``<s> x </s>``; decoding starts from ``</s>``)."""
    import pretrained_dirs

    return pretrained_dirs.bart_dir(path)


def _hf_builder(name: str) -> Callable[[Path, Variant], Path]:
    def build(path: Path, variant: Variant) -> Path:
        import pretrained_dirs

        if name == "gpt2":
            return pretrained_dirs.gpt2_dir(path)
        if name == "marian":
            return pretrained_dirs.marian_dir(path)
        if name == "bert-classifier":
            return pretrained_dirs.bert_dir(path, "BertForSequenceClassification", num_labels=2, id2label=dict(enumerate(LABELS)))
        return pretrained_dirs.bert_dir(path)

    return build


_HF: dict[str, Callable[[Path, Variant], Path]] = {
    "gpt2": _hf_builder("gpt2"), "bert": _hf_builder("bert"), "bert-classifier": _hf_builder("bert-classifier"),
    "marian": _hf_builder("marian"), "bart": _bart_dir,
}


def names(family: str | None = None) -> list[str]:
    """The variants of ``family`` (all of them for ``None``), in table order."""
    return [n for n, v in VARIANTS.items() if family is None or v.family == family]
