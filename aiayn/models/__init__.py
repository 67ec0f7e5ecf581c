"""The three Transformer families, their configs and presets."""

from aiayn.models.config import (
    DecoderOnlyConfig,
    EncoderDecoderConfig,
    EncoderOnlyConfig,
    TransformerConfig,
    config_from_dict,
    config_from_json,
)
from aiayn.models.decoder_only import DecoderOnly
from aiayn.models.encoder_decoder import EncoderDecoder
from aiayn.models.encoder_only import EncoderOnly
from aiayn.models.presets import PRESETS, build_model, preset

__all__ = [
    "TransformerConfig", "EncoderDecoderConfig", "DecoderOnlyConfig", "EncoderOnlyConfig",
    "config_from_dict", "config_from_json", "EncoderDecoder", "DecoderOnly", "EncoderOnly",
    "PRESETS", "build_model", "preset",
]
