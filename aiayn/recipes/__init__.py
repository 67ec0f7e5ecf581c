"""The packaged training recipes (one YAML per recipe), found by name: ``aiayn train shakespeare-char``."""

from __future__ import annotations

import difflib
from importlib import resources
from pathlib import Path

__all__ = ["recipe_names", "recipe_path", "recipe_summary", "resolve_config_path"]


def _directory() -> Path:
    return Path(str(resources.files(__name__)))


def recipe_names() -> list[str]:
    """The names of the packaged recipes, sorted."""
    return sorted(p.stem for p in _directory().glob("*.yaml"))


def recipe_path(name: str) -> Path:
    """The YAML file of the packaged recipe ``name``; ``ValueError`` listing the names (and the closest) otherwise."""
    path = _directory() / f"{name.removesuffix('.yaml')}.yaml"
    if not path.is_file():
        close = difflib.get_close_matches(name, recipe_names(), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"no recipe file or packaged recipe named {name!r}{hint}; packaged recipes: {', '.join(recipe_names())}")
    return path


def recipe_summary(name: str) -> str:
    """The first comment line of the recipe: what it trains."""
    for line in recipe_path(name).read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            return line.lstrip("# ").rstrip().rstrip(":")
    return ""


def resolve_config_path(config: str) -> Path:
    """``config`` as a file when it is one, else the packaged recipe of that name (``recipes/NAME.yaml``,
    the path in a source checkout before recipes became package data, names it too)."""
    path = Path(config)
    if path.is_file():
        return path
    return recipe_path(path.name if path.parent.name == "recipes" else config)
