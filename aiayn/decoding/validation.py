"""Field checks shared by the decoding configs: a broken rule raises ``ValueError`` naming field, value and rule."""

from __future__ import annotations

__all__ = ["is_int", "rule"]


def is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def rule(ok: bool, name: str, value: object, text: str) -> None:
    if not ok:
        raise ValueError(f"{name}={value!r} {text}")
