"""Typed, validated configs: one per family, sharing the block fields of :class:`TransformerConfig`.

Every field is validated at construction; a bad value raises ``ValueError`` naming the field, the
value and the rule. Configs round-trip through JSON (``to_dict`` / ``config_from_dict``) and are
stored in every checkpoint.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, ClassVar

from aiayn.nn.attention import BACKENDS
from aiayn.nn.blocks import LayerSpec
from aiayn.nn.feedforward import ACTIVATIONS
from aiayn.nn.kernels import ATTENTION_KINDS
from aiayn.nn.norm import NORMS
from aiayn.nn.positional import POSITION_KINDS
from aiayn.tokenization.special import PAD_ID
from aiayn.validation import check_choice, check_known_keys, check_positive, rule

__all__ = [
    "TransformerConfig",
    "EncoderDecoderConfig",
    "DecoderOnlyConfig",
    "EncoderOnlyConfig",
    "config_from_dict",
    "with_defaults",
    "config_from_json",
]


@dataclass(kw_only=True)
class TransformerConfig:
    """Fields shared by all families (defaults: the paper's base model, section 3 and Table 3)."""

    family: ClassVar[str] = ""

    vocab_size: int  # the source vocabulary (encoder-decoder: the target one too unless tgt_vocab_size is set)
    d_model: int = 512
    n_heads: int = 8
    n_kv_heads: int | None = None  # None = n_heads; fewer = grouped-query attention
    d_ff: int = 2048
    dropout: float = 0.1  # P_drop, section 5.4: sublayer outputs and embeddings + positions
    attention_dropout: float = 0.0
    activation_dropout: float = 0.0
    activation: str = "relu"
    norm: str = "layernorm"
    norm_eps: float = 1e-5
    norm_position: str = "post"  # "post" (the paper) or "pre"
    final_norm: bool | None = None  # None = only with Pre-LN
    positions: str = "sinusoidal"
    max_len: int = 1024  # longest sequence for learned positions (sinusoids grow on demand)
    rope_base: float = 10000.0
    bias: bool = True
    scale_embeddings: bool = True  # multiply embeddings by sqrt(d_model), section 3.4
    init_std: float | None = None  # None = Xavier-uniform linears; a float = normal(0, std) (GPT, BERT)
    attention_backend: str = "auto"  # auto (math for half-precision CPU training at <= 128 keys; one query at inference: as timed at load; else sdpa) | math | sdpa
    pad_id: int | None = PAD_ID  # None: no padding token (masks must then be given explicitly)
    attention: str = "softmax"  # self-attention kernel: softmax (the paper) | local | linear; cross-attention stays softmax
    window: int | None = None  # attention="local": keys per query (causal: the last window; bidirectional: centred)
    mixer: str = "attention"  # decoder-only: "ssm" replaces self-attention by a selective state-space layer (Mamba's S6)
    ssm_state: int = 16  # mixer="ssm": state size N per channel
    ssm_conv: int = 4  # mixer="ssm": width of the causal depthwise convolution
    ssm_expand: int = 2  # mixer="ssm": channels E = ssm_expand * d_model
    qk_norm: bool = False  # RMS-normalise queries and keys per head (a speedrun option; not in the paper)

    def __post_init__(self) -> None:
        _positives(self, "d_model", "n_heads", "d_ff", "max_len")
        if self.n_kv_heads is not None:
            _positives(self, "n_kv_heads")
        rule(self.d_model % self.n_heads == 0, "d_model", self.d_model, f"must be divisible by n_heads={self.n_heads}")
        kv = self.n_heads if self.n_kv_heads is None else self.n_kv_heads
        rule(self.n_heads % kv == 0, "n_kv_heads", self.n_kv_heads, f"must divide n_heads={self.n_heads}")
        for name in ("dropout", "attention_dropout", "activation_dropout"):
            value = getattr(self, name)
            rule(0.0 <= value < 1.0, name, value, "must be in [0, 1)")
        _field_choice(self, "activation", ACTIVATIONS)
        _field_choice(self, "norm", NORMS)
        _field_choice(self, "norm_position", ("post", "pre"))
        _field_choice(self, "positions", POSITION_KINDS)
        _field_choice(self, "attention_backend", BACKENDS)
        rule(self.norm_eps > 0, "norm_eps", self.norm_eps, "must be > 0")
        rule(self.rope_base > 0, "rope_base", self.rope_base, "must be > 0")
        if self.init_std is not None:
            rule(self.init_std > 0, "init_std", self.init_std, "must be > 0 or None")
        if self.positions == "rotary":
            head_dim = self.d_model // self.n_heads
            rule(head_dim % 2 == 0, "positions", self.positions, f"rotary needs an even head size, got {head_dim}")
        if self.pad_id is not None:
            rule(self.pad_id >= 0, "pad_id", self.pad_id, "must be >= 0 or None")
        self._check_efficient_attention()

    def _check_efficient_attention(self) -> None:
        """The variants of issue 18: attention kernel, window, state-space mixer."""
        _field_choice(self, "attention", ATTENTION_KINDS)
        if self.window is not None:
            _positives(self, "window")
            rule(self.attention == "local", "window", self.window, f"needs attention='local', got attention={self.attention!r}")
        rule(self.attention != "local" or self.window is not None, "window", self.window, "must be set with attention='local' (keys per query)")
        rule(self.attention == "softmax" or self.positions != "alibi", "positions", self.positions,
              f"adds a score bias, which attention={self.attention!r} cannot take; use rotary, sinusoidal or learned")
        rule(self.attention != "linear" or self.attention_dropout == 0.0, "attention_dropout", self.attention_dropout,
              "must be 0 with attention='linear' (there are no attention weights to drop)")
        _field_choice(self, "mixer", ("attention", "ssm"))
        _positives(self, "ssm_state", "ssm_conv", "ssm_expand")
        if self.mixer == "ssm":
            rule(self.family == "decoder-only", "mixer", self.mixer, f"is for the decoder-only family, not {self.family}")
            rule(self.attention == "softmax", "attention", self.attention, "has no effect with mixer='ssm' (no attention layers): leave it 'softmax'")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def pre_norm(self) -> bool:
        return self.norm_position == "pre"

    @property
    def has_final_norm(self) -> bool:
        return self.pre_norm if self.final_norm is None else self.final_norm

    def layer_spec(self) -> LayerSpec:
        """The per-layer part of the config."""
        return LayerSpec(
            d_model=self.d_model, n_heads=self.n_heads, d_ff=self.d_ff, n_kv_heads=self.n_kv_heads,
            dropout=self.dropout, attention_dropout=self.attention_dropout,
            activation_dropout=self.activation_dropout, activation=self.activation, norm=self.norm,
            norm_eps=self.norm_eps, pre_norm=self.pre_norm, bias=self.bias, backend=self.attention_backend,
            attention=self.attention, window=self.window, mixer=self.mixer, ssm_state=self.ssm_state,
            ssm_conv=self.ssm_conv, ssm_expand=self.ssm_expand,
            qk_norm=self.qk_norm,
        )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict, with ``family`` naming the config class."""
        return {"family": self.family, **dataclasses.asdict(self)}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    def replace(self, **overrides: Any) -> TransformerConfig:
        """A copy with some fields changed (validated again); unknown names raise ``ValueError``."""
        _check_keys(type(self), overrides)
        return dataclasses.replace(self, **overrides)


@dataclass(kw_only=True)
class EncoderDecoderConfig(TransformerConfig):
    """The paper's model: an encoder and an autoregressive decoder with cross-attention (translation)."""

    family: ClassVar[str] = "encoder-decoder"

    tgt_vocab_size: int | None = None
    n_encoder_layers: int = 6
    n_decoder_layers: int = 6
    share_embeddings: bool = True  # one table for source and target (needs one shared vocabulary)
    tie_output: bool = True  # target embedding = pre-softmax projection (section 3.4)
    embedding_norm: bool = False  # BART: a norm on embeddings + positions, on each side
    output_bias: bool = False  # BART: a bias on the output logits (final_logits_bias)

    def __post_init__(self) -> None:
        super().__post_init__()
        _positives(self, "vocab_size", "n_encoder_layers", "n_decoder_layers")
        if self.tgt_vocab_size is not None:
            _positives(self, "tgt_vocab_size")
            rule(
                not self.share_embeddings, "share_embeddings", self.share_embeddings,
                f"needs one shared vocabulary: set tgt_vocab_size=None (got {self.tgt_vocab_size}) or share_embeddings=False",
            )
        _check_pad_id(self)

    @property
    def target_vocab_size(self) -> int:
        return self.vocab_size if self.tgt_vocab_size is None else self.tgt_vocab_size


@dataclass(kw_only=True)
class DecoderOnlyConfig(TransformerConfig):
    """A GPT-style language model: a causal stack with no encoder."""

    family: ClassVar[str] = "decoder-only"

    n_layers: int = 12
    tie_output: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        _positives(self, "vocab_size", "n_layers")
        _check_pad_id(self)


@dataclass(kw_only=True)
class EncoderOnlyConfig(TransformerConfig):
    """A BERT-style encoder: token + position + segment embeddings, masked-LM and classification heads."""

    family: ClassVar[str] = "encoder-only"

    n_layers: int = 12
    n_segments: int = 2  # 0 = no segment embeddings
    n_classes: int = 2  # 0 = no classification head
    embedding_norm: bool = True  # BERT normalises the summed embeddings
    mlm_head: bool = True
    pooler: bool | None = None  # the tanh pooler on [CLS]; None = only with a classification head
    pooling: str = "cls"  # what the pooler reads: cls = the first position (BERT), mean = the mean of the real tokens
    tie_output: bool = True  # the masked-LM decoder shares the token embedding

    def __post_init__(self) -> None:
        super().__post_init__()
        _positives(self, "vocab_size", "n_layers")
        rule(self.n_segments >= 0, "n_segments", self.n_segments, "must be >= 0")
        rule(self.n_classes >= 0, "n_classes", self.n_classes, "must be >= 0")
        rule(self.pooler is not False or self.n_classes == 0, "pooler", self.pooler, "must not be False with a classification head (n_classes > 0)")
        rule(self.pooling in ("cls", "mean"), "pooling", self.pooling, "must be 'cls' or 'mean'")
        _check_pad_id(self)


FAMILIES: dict[str, type[TransformerConfig]] = {
    cls.family: cls for cls in (EncoderDecoderConfig, DecoderOnlyConfig, EncoderOnlyConfig)
}


def config_from_dict(data: dict[str, Any]) -> TransformerConfig:
    """Rebuild a config from :meth:`TransformerConfig.to_dict`; the ``family`` key picks the class."""
    data = dict(data)
    family = data.pop("family", None)
    if family not in FAMILIES:
        raise ValueError(f"family must be one of {sorted(FAMILIES)}, got {family!r}")
    cls = FAMILIES[family]
    _check_keys(cls, data)
    return cls(**data)


def with_defaults(data: dict[str, Any]) -> dict[str, Any]:
    """A stored config with the fields it does not record (saved before they existed) at their
    defaults, so that two configs compare by meaning; one this version cannot read stays as stored."""
    try:
        return config_from_dict(data).to_dict()
    except (TypeError, ValueError):
        return data


def config_from_json(text: str) -> TransformerConfig:
    return config_from_dict(json.loads(text))


def _check_keys(cls: type, data: dict[str, Any]) -> None:
    check_known_keys(data, [f.name for f in dataclasses.fields(cls)], owner=cls.__name__)


def _check_pad_id(config: Any) -> None:
    if config.pad_id is not None:
        rule(config.pad_id < config.vocab_size, "pad_id", config.pad_id, f"must be < vocab_size={config.vocab_size}")


def _positives(config: Any, *names: str) -> None:
    for name in names:
        check_positive(name, getattr(config, name))


def _field_choice(config: Any, name: str, choices: tuple[str, ...]) -> None:
    check_choice(name, getattr(config, name), choices)
