"""What the family tables share: the architecture record, config checks, activation names."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from aiayn.interop.keymap import Ignore, Rule
from aiayn.models.config import TransformerConfig
from aiayn.nn.feedforward import ACTIVATIONS

__all__ = [
    "Architecture",
    "ConfigError",
    "hf_activation",
    "our_activation",
    "require",
    "require_ours",
    "warn_training_only",
    "layer_rules",
]

log = logging.getLogger(__name__)


class ConfigError(ValueError):
    """A config (ours or theirs) that the other side cannot represent exactly; names the field and value."""


@dataclass(frozen=True)
class Architecture:
    """One Hugging Face class and how it maps onto one of our families.

    ``prefix``: the base model's attribute (``transformer``, ``bert``); keys under it are stored with
    it by the head classes and without it by the base class, and the rules use neither (Marian's rules
    spell ``model.`` out: only the head class is supported).
    ``fits``: why a config of ours cannot be exported as this class, or ``None`` if it can.
    """

    name: str
    model_type: str
    prefix: str
    config_from_hf: Callable[[dict[str, Any], Mapping[str, Tensor]], TransformerConfig]  # (config.json, weights)
    config_to_hf: Callable[[TransformerConfig], dict[str, Any]]
    rules: Callable[[TransformerConfig], list[Rule]]
    ignores: tuple[Ignore, ...]
    fits: Callable[[TransformerConfig], str | None]
    heads: tuple[str, ...] = ()  # key prefixes of the head modules, which sit outside ``prefix``
    base_model: bool = False  # the base class itself (BertModel): its keys are saved without ``prefix``

    def add_prefix(self, key: str) -> str:
        """Our table's key -> the key this class saves."""
        if not self.prefix or self.base_model or key.startswith(self.heads):
            return key
        return f"{self.prefix}.{key}"


# Hugging Face activation names (transformers.activations.ACT2FN) -> ours. "gelu_new" is GPT-2's tanh
# approximation, the same function as torch's gelu(approximate="tanh").
_FROM_HF = {"relu": "relu", "gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}
if "silu" in ACTIVATIONS:  # opus-mt (Marian) models use swish; enabled as soon as the core has it
    _FROM_HF.update({"swish": "silu", "silu": "silu"})
_TO_HF = {"relu": "relu", "gelu": "gelu", "gelu_tanh": "gelu_new", "silu": "swish"}


def our_activation(name: Any, field: str, arch: str) -> str:
    if name not in _FROM_HF:
        core = " (the core has no plain SiLU activation yet)" if name in ("swish", "silu") else ""
        raise ConfigError(
            f"{arch}: {field}={name!r} has no exact equivalent in aiayn{core}; supported: {', '.join(sorted(_FROM_HF))}"
        )
    return _FROM_HF[name]


def hf_activation(name: str, arch: str) -> str:
    if name not in _TO_HF:
        raise ConfigError(f"cannot export to {arch}: activation={name!r} has no Hugging Face equivalent here")
    return _TO_HF[name]


def require(hf: dict[str, Any], key: str, allowed: tuple[Any, ...], arch: str, why: str = "") -> None:
    """Raise unless ``hf[key]`` (when present) is one of ``allowed``."""
    if key in hf and hf[key] not in allowed:
        reason = f" ({why})" if why else ""
        raise ConfigError(f"{arch}: {key}={hf[key]!r} is not supported{reason}; aiayn needs one of {allowed}")


def require_ours(config: TransformerConfig, arch: str, **expected: Any) -> str | None:
    """Why ``config`` cannot be exported to ``arch`` (the first field whose value differs), or ``None``."""
    for name, allowed in expected.items():
        allowed = allowed if isinstance(allowed, tuple) else (allowed,)
        value = getattr(config, name)
        if value not in allowed:
            want = allowed[0] if len(allowed) == 1 else f"one of {allowed}"
            return f"{name}={value!r}, but {arch} needs {want!r}"
    return None


def warn_training_only(arch: str, message: str) -> None:
    """Differences that change training (dropout) but not inference are logged, not raised."""
    log.warning("%s: %s (affects training only; inference is exact)", arch, message)


def layer_rules(
    table: tuple[tuple[str, str | tuple[str, ...], Any], ...], n_layers: int, theirs_prefix: str, ours_prefix: str
) -> list[Rule]:
    """Expand a per-layer table ``(theirs, ours, transform)`` for layers ``0..n_layers-1``."""
    rules = []
    for i in range(n_layers):
        for theirs, ours, transform in table:
            ours_keys = (ours,) if isinstance(ours, str) else ours
            rules.append(
                Rule(
                    theirs=f"{theirs_prefix.format(i=i)}{theirs}",
                    ours=tuple(f"{ours_prefix.format(i=i)}{k}" for k in ours_keys),
                    transform=transform,
                )
            )
    return rules
