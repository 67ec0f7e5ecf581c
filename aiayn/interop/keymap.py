"""The machinery behind every family's key-map table: rules, tensor transforms, strict matching.

A *rule* ties one foreign tensor (a Hugging Face state-dict key) to zero or more of our tensors,
with a transform that is exact in both directions: ``to_ours`` on import, ``to_theirs`` on export.
Matching is strict: a foreign key that no rule (and no explicit ignore pattern) claims, a rule whose
key is absent, or one of our parameters that no rule fills, raises :class:`KeyMapError` listing them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

__all__ = [
    "KeyMapError",
    "Transform",
    "COPY",
    "TRANSPOSE",
    "FUSED_QKV_CONV1D_WEIGHT",
    "FUSED_QKV_BIAS",
    "permute_axis",
    "derived",
    "Rule",
    "Ignore",
    "import_tensors",
    "export_tensors",
    "load_into",
    "tied_keys",
]


class KeyMapError(ValueError):
    """Foreign keys that no rule claims, rules whose keys are absent, or tensors that do not fit."""


@dataclass(frozen=True)
class Transform:
    """How one foreign tensor becomes our tensor(s) and back; both directions are exact (no arithmetic)."""

    name: str
    to_ours: Callable[[Tensor], tuple[Tensor, ...]]
    to_theirs: Callable[..., Tensor]


def _one(t: Tensor) -> tuple[Tensor, ...]:
    return (t,)


COPY = Transform("copy", _one, lambda t: t)
# transformers' Conv1D (GPT-2) stores weights as (in, out); nn.Linear as (out, in).
TRANSPOSE = Transform("transpose", lambda t: (t.t().contiguous(),), lambda t: t.t().contiguous())
# GPT-2's c_attn is one Conv1D (D, 3D) holding [q | k | v] side by side.
FUSED_QKV_CONV1D_WEIGHT = Transform(
    "transpose+split-qkv",
    lambda t: tuple(part.contiguous() for part in t.t().chunk(3, dim=0)),  # (3D, D) -> 3 x (D, D)
    lambda q, k, v: torch.cat([q, k, v], dim=0).t().contiguous(),
)
FUSED_QKV_BIAS = Transform(
    "split-qkv",
    lambda t: tuple(part.contiguous() for part in t.chunk(3, dim=0)),
    lambda q, k, v: torch.cat([q, k, v], dim=0),
)


def permute_axis(axis: int, perm: Tensor) -> Transform:
    """Reorder ``axis`` so that ``ours[..., j, ...] = theirs[..., perm[j], ...]`` (and back on export)."""
    inverse = torch.argsort(perm)
    return Transform(
        f"permute-axis-{axis}",
        lambda t: (t.index_select(axis, perm.to(t.device)),),
        lambda t: t.index_select(axis, inverse.to(t.device)),
    )


def derived(name: str, check: Callable[[Tensor], str | None], make: Callable[[], Tensor] | None) -> Transform:
    """A foreign tensor with no counterpart of ours, fixed by the config: ``check`` returns why it does
    not fit (or ``None``); ``make`` builds it on export (``None``: not written, as transformers skips it)."""

    def to_ours(t: Tensor) -> tuple[Tensor, ...]:
        problem = check(t)
        if problem:
            raise KeyMapError(problem)
        return ()

    def to_theirs() -> Tensor:
        if make is None:
            raise AssertionError("derived tensor without a maker is never exported")
        return make()

    return Transform(name, to_ours, to_theirs)


@dataclass(frozen=True)
class Rule:
    """One foreign key (``theirs``) <-> our keys (``ours``), through ``transform``.

    ``aliases``: other foreign keys holding the same (tied) tensor; any subset may be present on
    import (they must then be equal), none is written on export. ``optional``: absent is fine on
    import. ``export``: written on export (False for keys transformers itself does not save).
    """

    theirs: str
    ours: tuple[str, ...]
    transform: Transform = COPY
    aliases: tuple[str, ...] = ()
    optional: bool = False
    export: bool = True


@dataclass(frozen=True)
class Ignore:
    """Foreign keys (a regular expression, full match) that are dropped on import, with the reason."""

    pattern: str
    reason: str
    check: Callable[[str, Tensor], str | None] | None = field(default=None)


def import_tensors(
    theirs: Mapping[str, Tensor],
    rules: Iterable[Rule],
    ignores: Iterable[Ignore] = (),
    display: Callable[[str], str] = lambda key: key,
    shapes: Mapping[str, tuple[int, ...]] | None = None,
) -> tuple[dict[str, Tensor], list[str]]:
    """Foreign tensors -> our tensors. Returns ``(ours, dropped)``, ``dropped`` being the ignored keys.

    Raises :class:`KeyMapError` listing every missing and every unmatched foreign key at once.
    ``display`` turns a key of ``theirs`` into the name to report (the key as stored in the file);
    ``shapes``: our model's shapes, so that a misfit is reported under the foreign key.
    """
    ours: dict[str, Tensor] = {}
    used: set[str] = set()
    missing: list[str] = []
    problems: list[str] = []
    for rule in rules:
        present = [k for k in (rule.theirs, *rule.aliases) if k in theirs]
        if not present:
            if not rule.optional:
                missing.append(display(rule.theirs))
            continue
        used.update(present)
        tensor = theirs[present[0]]
        for other in present[1:]:
            if theirs[other].shape != tensor.shape or not torch.equal(theirs[other], tensor):
                problems.append(f"{display(other)} should be tied to {display(present[0])} but holds different values")
        try:
            parts = rule.transform.to_ours(tensor)
        except KeyMapError as e:
            problems.append(f"{display(present[0])}: {e}")
            continue
        except RuntimeError as e:  # a fused tensor that does not split evenly, for instance
            problems.append(f"{display(present[0])}: shape {tuple(tensor.shape)} does not fit {rule.transform.name}: {e}")
            continue
        if len(parts) != len(rule.ours):
            raise AssertionError(f"rule for {rule.theirs} gives {len(parts)} tensors for {len(rule.ours)} keys")
        for key, part in zip(rule.ours, parts):
            want = tuple(shapes[key]) if shapes is not None and key in shapes else tuple(part.shape)
            if tuple(part.shape) != want:
                problems.append(
                    f"{display(present[0])}: shape {tuple(tensor.shape)} does not fit {key} {want} ({rule.transform.name})"
                )
                break
        else:
            ours.update(zip(rule.ours, parts))
    dropped: list[str] = []
    unmatched: list[str] = []
    compiled = [(re.compile(i.pattern), i) for i in ignores]
    for key in theirs:
        if key in used:
            continue
        ignore = next((i for pattern, i in compiled if pattern.fullmatch(key)), None)
        if ignore is None:
            unmatched.append(display(key))
            continue
        problem = ignore.check(key, theirs[key]) if ignore.check else None
        if problem:
            problems.append(f"{display(key)}: {problem}")
        dropped.append(display(key))
    if missing or unmatched or problems:
        raise KeyMapError(_report(missing=missing, unmatched=sorted(unmatched), problems=problems))
    return ours, dropped


def export_tensors(ours: Mapping[str, Tensor], rules: Iterable[Rule], tied: Mapping[str, str]) -> dict[str, Tensor]:
    """Our tensors -> foreign tensors (only the rules with ``export``).

    ``tied`` maps each of our keys to the key of the tensor it shares storage with (itself if none).
    Raises :class:`KeyMapError` if one of our tensors has no rule, or a rule names a key we lack.
    """
    theirs: dict[str, Tensor] = {}
    covered: set[str] = set()
    missing: list[str] = []
    for rule in rules:
        absent = [k for k in rule.ours if k not in ours]
        if absent:
            missing.extend(absent)
            continue
        covered.update(rule.ours)
        if rule.export:
            theirs[rule.theirs] = rule.transform.to_theirs(*(ours[k].detach() for k in rule.ours))
    covered_canonical = {tied.get(k, k) for k in covered}
    uncovered = [k for k in ours if k not in covered and tied.get(k, k) not in covered_canonical]
    if missing or uncovered:
        raise KeyMapError(
            _report(
                missing=missing, unmatched=uncovered,
                missing_label="the table names keys this model does not have",
                unmatched_label="tensors of this model that no rule exports",
            )
        )
    return theirs


def tied_keys(model: nn.Module) -> dict[str, str]:
    """Each state-dict key -> the first key naming the same tensor (tied embeddings, shared positions)."""
    first: dict[int, str] = {}
    out: dict[str, str] = {}
    for name, tensor in model.state_dict(keep_vars=True).items():
        out[name] = first.setdefault(id(tensor), name)
    return out


def load_into(model: nn.Module, tensors: Mapping[str, Tensor]) -> None:
    """Load ``tensors`` into ``model`` strictly; a tied tensor may be given under any of its names.

    Raises :class:`KeyMapError` listing our keys left unfilled, keys the model lacks, shape
    mismatches, and tied names given different values.
    """
    tied = tied_keys(model)
    state = model.state_dict()
    unknown = [k for k in tensors if k not in state]
    by_canonical: dict[str, tuple[str, Tensor]] = {}
    problems: list[str] = []
    for key, tensor in tensors.items():
        if key not in state:
            continue
        canonical = tied[key]
        if canonical in by_canonical and not torch.equal(by_canonical[canonical][1], tensor):
            problems.append(f"{key} is tied to {by_canonical[canonical][0]} in this model but the values differ")
        by_canonical.setdefault(canonical, (key, tensor))
        if tuple(tensor.shape) != tuple(state[key].shape):
            problems.append(f"{key}: shape {tuple(tensor.shape)} does not fit the model's {tuple(state[key].shape)}")
    unfilled = sorted({tied[k] for k in state if tied[k] not in by_canonical})
    if unknown or unfilled or problems:
        raise KeyMapError(
            _report(
                missing=unfilled, unmatched=unknown, problems=problems,
                missing_label="parameters of the model left unfilled", unmatched_label="keys the model does not have",
            )
        )
    full = {k: by_canonical[tied[k]][1] for k in state}
    model.load_state_dict(full, strict=True)


def _report(
    *,
    missing: Sequence[str],
    unmatched: Sequence[str],
    problems: Sequence[str] = (),
    missing_label: str = "missing keys (expected, not found)",
    unmatched_label: str = "unmatched keys (found, no rule maps them)",
) -> str:
    lines = []
    if missing:
        lines.append(f"{len(missing)} {missing_label}: {', '.join(missing)}")
    if unmatched:
        lines.append(f"{len(unmatched)} {unmatched_label}: {', '.join(unmatched)}")
    lines.extend(problems)
    return "; ".join(lines)
