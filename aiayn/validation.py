"""Value checks shared by every config (models, decoding, training, optimizer): a broken rule raises
``ValueError`` in one format, ``NAME=VALUE RULE`` (for example ``d_model=30 must be divisible by n_heads=4``);
a key a config does not have, in one format too (:func:`check_known_keys`)."""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable, Sequence

__all__ = ["is_int", "is_number", "rule", "check_int", "check_number", "check_choice", "check_positive", "check_known_keys"]


def is_int(value: object) -> bool:
    """An ``int`` that is not a ``bool``."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: object) -> bool:
    """A finite ``int`` or ``float`` that is not a ``bool``."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def rule(ok: bool, name: str, value: object, text: str) -> None:
    """Raise ``ValueError("NAME=VALUE TEXT")`` unless ``ok``."""
    if not ok:
        raise ValueError(f"{name}={value!r} {text}")


def check_int(name: str, value: object, *, minimum: int) -> None:
    rule(is_int(value) and value >= minimum, name, value, f"must be an int >= {minimum}")  # type: ignore[operator]


def check_positive(name: str, value: object) -> None:
    rule(is_int(value) and value > 0, name, value, "must be a positive integer")  # type: ignore[operator]


def check_number(name: str, value: object, *, minimum: float, inclusive: bool) -> None:
    ok = is_number(value) and (value >= minimum if inclusive else value > minimum)  # type: ignore[operator]
    rule(ok, name, value, f"must be a finite number {'>=' if inclusive else '>'} {minimum}")


def check_choice(name: str, value: object, choices: Sequence[object]) -> None:
    rule(value in choices, name, value, f"must be one of {tuple(choices)}")


def check_known_keys(keys: Iterable[object], valid: Sequence[str], *, owner: str, path: str = "") -> None:
    """``ValueError`` for the first of ``keys`` not in ``valid``, naming it (dotted under ``path``), the closest
    valid key and all of them: ``unknown key 'optim.lrr' for OptimConfig (did you mean 'optim.lr'?); valid keys: ...``."""
    prefix = f"{path}." if path else ""
    for key in keys:
        if key not in valid:
            close = difflib.get_close_matches(str(key), valid, n=1)
            hint = f" (did you mean {prefix + close[0]!r}?)" if close else ""
            raise ValueError(f"unknown key {prefix + str(key)!r} for {owner}{hint}; valid keys: {', '.join(valid)}")
