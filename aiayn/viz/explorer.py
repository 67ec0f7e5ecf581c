"""One self-contained HTML file to explore attention: no network, inline CSS/JS, the weights as JSON.

Pick the kind of attention, the layer and the head (or their mean); hover a query token to see
where it attends, a key token to see what attends to it; click a thumbnail to jump to a head.
The page is ``explorer.html`` beside this module with the data put in its JSON block.
"""

from __future__ import annotations

import json
import os
from importlib import resources
from pathlib import Path

import numpy as np

from aiayn.viz.attention import AttentionView

__all__ = ["explorer_html", "write_explorer"]

_PLACEHOLDER = "/*__DATA__*/"


def explorer_html(views: list[AttentionView], *, title: str, subtitle: str = "", decimals: int = 4) -> str:
    """The page as a string; weights are rounded to ``decimals`` places to keep the file small."""
    if not views:
        raise ValueError("views must not be empty: there is no attention to show")
    data = {
        "title": title,
        "subtitle": subtitle,
        "views": [
            {
                "name": v.name,
                "title": v.title,
                "queries": v.queries,
                "keys": v.keys,
                "layers": int(v.weights.shape[0]),
                "heads": int(v.weights.shape[1]),
                "weights": np.round(v.weights.astype(np.float64), decimals).tolist(),  # (L, H, T, S)
            }
            for v in views
        ],
    }
    # Inside <script>, "</script" ends the element and "<!--<script" sends the HTML parser into its
    # "double-escaped" state (the page goes blank): the user's text must hold no "<", ">" or "&". JSON has
    # them only inside strings, where "\u003c" is the same string, so every one is escaped.
    payload = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    payload = payload.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")
    template = resources.files("aiayn.viz").joinpath("explorer.html").read_text(encoding="utf-8")
    if template.count(_PLACEHOLDER) != 1:
        raise RuntimeError(f"explorer.html must hold the placeholder {_PLACEHOLDER} exactly once")
    return template.replace(_PLACEHOLDER, payload)


def write_explorer(views: list[AttentionView], path: str | os.PathLike[str], *, title: str, subtitle: str = "") -> Path:
    """Write the page to ``path`` (parents created) and return the path."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(explorer_html(views, title=title, subtitle=subtitle), encoding="utf-8")
    return target
