"""aiayn: the Transformer of "Attention Is All You Need" and its three families, to build, train, run and inspect."""

__version__ = "0.1.0"

from aiayn.api import LoadedModel, load  # noqa: E402
from aiayn.models import (  # noqa: E402
    PRESETS,
    DecoderOnly,
    DecoderOnlyConfig,
    EncoderDecoder,
    EncoderDecoderConfig,
    EncoderOnly,
    EncoderOnlyConfig,
    build_model,
    preset,
)

__all__ = [
    "__version__", "build_model", "preset", "PRESETS", "EncoderDecoder", "DecoderOnly", "EncoderOnly",
    "EncoderDecoderConfig", "DecoderOnlyConfig", "EncoderOnlyConfig", "load", "LoadedModel",
]
