"""Named model configurations, looked up by exact name, and ``build_model``."""

from __future__ import annotations

from typing import Any, Callable

from torch import nn

from aiayn.models.config import (
    DecoderOnlyConfig,
    EncoderDecoderConfig,
    EncoderOnlyConfig,
    TransformerConfig,
    config_from_dict,
)
from aiayn.models.decoder_only import DecoderOnly
from aiayn.models.encoder_decoder import EncoderDecoder
from aiayn.models.encoder_only import EncoderOnly

__all__ = ["PRESETS", "preset", "describe_preset", "build_model", "model_class"]

# Table 3 of the paper: base (65M params) and big (213M), with a shared 37k BPE vocabulary (section 5.1).
PRESETS: dict[str, Callable[[], TransformerConfig]] = {
    "paper-base": lambda: EncoderDecoderConfig(
        vocab_size=37000, n_encoder_layers=6, n_decoder_layers=6, d_model=512, d_ff=2048, n_heads=8, dropout=0.1,
    ),
    "paper-big": lambda: EncoderDecoderConfig(
        vocab_size=37000, n_encoder_layers=6, n_decoder_layers=6, d_model=1024, d_ff=4096, n_heads=16, dropout=0.3,
    ),
    # GPT-2 small (124M): learned positions, Pre-LN with a final norm, tanh-GELU, tied output.
    "gpt2-small": lambda: DecoderOnlyConfig(
        vocab_size=50257, n_layers=12, d_model=768, n_heads=12, d_ff=3072, dropout=0.1, activation="gelu_tanh",
        norm_position="pre", positions="learned", max_len=1024, scale_embeddings=False, init_std=0.02, pad_id=None,
    ),
    # BERT-base (110M): learned positions and segments, Post-LN, GELU, normalised embeddings.
    "bert-base": lambda: EncoderOnlyConfig(
        vocab_size=30522, n_layers=12, d_model=768, n_heads=12, d_ff=3072, dropout=0.1, activation="gelu",
        positions="learned", max_len=512, norm_eps=1e-12, scale_embeddings=False, init_std=0.02,
    ),
    "tiny-encoder-decoder": lambda: EncoderDecoderConfig(
        vocab_size=64, n_encoder_layers=2, n_decoder_layers=2, d_model=32, d_ff=64, n_heads=4, dropout=0.0,
    ),
    "tiny-decoder-only": lambda: DecoderOnlyConfig(
        vocab_size=64, n_layers=2, d_model=32, d_ff=64, n_heads=4, dropout=0.0, norm_position="pre",
        positions="learned", max_len=128, scale_embeddings=False, init_std=0.02,
    ),
    "tiny-encoder-only": lambda: EncoderOnlyConfig(
        vocab_size=64, n_layers=2, d_model=32, d_ff=64, n_heads=4, dropout=0.0, activation="gelu",
        positions="learned", max_len=128, scale_embeddings=False, init_std=0.02,
    ),
}

_MODELS: dict[type, type[nn.Module]] = {
    EncoderDecoderConfig: EncoderDecoder,
    DecoderOnlyConfig: DecoderOnly,
    EncoderOnlyConfig: EncoderOnly,
}


def preset(name: str, **overrides: Any) -> TransformerConfig:
    """The config named ``name`` (exact match), with fields replaced by ``overrides``."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; valid presets: {', '.join(PRESETS)}")
    config = PRESETS[name]()
    return config.replace(**overrides) if overrides else config


def describe_preset(name: str) -> str:
    """One line: the family and shapes of preset ``name``."""
    c = preset(name)
    if isinstance(c, EncoderDecoderConfig):
        layers = f"{c.n_encoder_layers}+{c.n_decoder_layers}"
    else:
        assert isinstance(c, (DecoderOnlyConfig, EncoderOnlyConfig))
        layers = str(c.n_layers)
    return (f"{c.family}: {layers} layers, d_model {c.d_model}, {c.n_heads} heads, d_ff {c.d_ff}, "
            f"{c.positions} positions, {c.norm_position}-LN, vocab {c.vocab_size}")


def model_class(config: TransformerConfig) -> type[nn.Module]:
    """The model class of a config's family."""
    return _MODELS[type(config)]


def build_model(name_or_config: str | TransformerConfig | dict[str, Any], **overrides: Any) -> nn.Module:
    """Build a model from a preset name, a config, or a config dict (``to_dict`` form).

    Example: ``build_model("paper-base", vocab_size=37000)``. Raises ``ValueError`` for an unknown
    preset or field, or a field value that breaks a rule.
    """
    if isinstance(name_or_config, str):
        config = preset(name_or_config, **overrides)
    else:
        config = config_from_dict(name_or_config) if isinstance(name_or_config, dict) else name_or_config
        if not isinstance(config, TransformerConfig):
            raise TypeError(f"name_or_config must be a preset name, a config or a dict, got {type(config).__name__}")
        if overrides:
            config = config.replace(**overrides)
    return model_class(config)(config)
