"""Loading the served model: the ONE place the server turns a directory into a model and tokenizers.

It goes through :func:`aiayn.api.load_parts`, the loader of ``aiayn.load`` and every command: our
directories, checkpoints and runs, or a Hugging Face directory with its own tokenizer, with the
weights cast once at load (``dtype``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from torch import nn

from aiayn.api import LoadedModel, load_parts
from aiayn.inference.precision import DTYPES, dtype_name  # the names every inference command accepts
from aiayn.models.config import TransformerConfig
from aiayn.nn.positional import LearnedPositions
from aiayn.tokenization.base import Tokenizer
from aiayn.training.config import DecodeSection

__all__ = ["DTYPES", "ServedModel", "load_served_model"]


@dataclass
class ServedModel:
    """What the server needs: the model (eval mode), its config, tokenizers, the name it is served
    under, and its class names (``labels``: ``None`` where the checkpoint has none)."""

    model: nn.Module
    config: TransformerConfig
    src_tokenizer: Tokenizer
    tgt_tokenizer: Tokenizer
    name: str
    labels: list[str] | None = None
    path: Path | None = None  # the directory it was loaded from (sentence-transformers' pooling files: /v1/embeddings)
    decode: DecodeSection = field(default_factory=DecodeSection)  # a translation's beam search unless the request says

    @property
    def family(self) -> str:
        return self.config.family

    @property
    def window(self) -> int | None:
        """A decoder-only model's learned positions (``max_len``): past them a window slides; ``None``
        where positions extrapolate or there are none to slide (other families)."""
        positions = getattr(self.model, "positions", None)
        return positions.max_len if isinstance(positions, LearnedPositions) else None

    def as_loaded(self) -> LoadedModel:
        """The model as ``aiayn.load`` gives it, so an endpoint runs the very code Python runs."""
        return LoadedModel(self.model, self.src_tokenizer, self.tgt_tokenizer, path=Path(self.name), labels=self.labels,
                           decode=self.decode)


def load_served_model(
    checkpoint: str | os.PathLike[str], *, dtype: str = "float32", device: str = "cpu", name: str | None = None,
    pack: bool = True, quantize: str | None = None,
) -> ServedModel:
    """Load a model directory, checkpoint or run directory for serving, in ``dtype`` on ``device`` (``pack``,
    ``quantize``: see :func:`~aiayn.pretrained.load_pretrained`).

    Raises ``ValueError`` for an unknown ``dtype`` or a model saved without tokenizers (text cannot be
    encoded), ``FileNotFoundError`` when there is nothing at ``checkpoint``.
    """
    dtype = dtype_name(dtype)  # "bf16" is "bfloat16"; ValueError naming dtype and the choices
    loaded = load_parts(checkpoint, device=device, dtype=None if dtype == "float32" else dtype, quantize=quantize, pack=pack)
    if loaded.src_tokenizer is None or loaded.tgt_tokenizer is None:
        raise ValueError(f"checkpoint {checkpoint} holds no tokenizer, so the server could not encode text")
    return ServedModel(loaded.model, loaded.config, loaded.src_tokenizer, loaded.tgt_tokenizer, name or Path(checkpoint).resolve().name,
                       loaded.labels, loaded.path, loaded.decode)
