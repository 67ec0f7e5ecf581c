"""The ``AIAYN_*`` environment overrides, read one way: a named choice, case and spaces ignored, an unknown value refused
naming the variable (``AIAYN_ALLOCATOR``, ``AIAYN_LINEAR_KERNEL``, ``AIAYN_ATTENTION_KERNEL``). No torch import: the
allocator reads its variable before torch loads. And where the user cache is (:func:`user_cache_dir`)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

__all__ = ["env_choice", "user_cache_dir"]


def user_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/aiayn``, else ``~/.cache/aiayn``: downloaded data, the kernel choices, the native kernel's build."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "aiayn"


def env_choice(variable: str, choices: tuple[str, ...], env: Mapping[str, str] = os.environ) -> str:
    """``$variable``, one of ``choices`` (unset or blank: ``choices[0]``, the default); a ``ValueError`` naming the
    variable, the choices and the value otherwise."""
    mode = env.get(variable, choices[0]).strip().lower() or choices[0]
    if mode not in choices:
        raise ValueError(f"${variable} must be one of {', '.join(choices)}, got {env[variable]!r}")
    return mode
