"""The one reader of untrusted JSON and YAML: markers, configs, tokenizer files, labels, ``--set`` values.

Files from elsewhere (a model directory, a checkpoint, a Hugging Face download) are bounded before
they are parsed: a regular file only (a FIFO would block, a device would never end), at most
``max_bytes``, and nested at most ``MAX_DEPTH`` deep (the parsers recurse, so a document nested
100,000 deep would end in ``RecursionError``, and so would every recursive walk after them). Every
error is an :class:`UntrustedInputError` (a ``ValueError``) naming the file, the size or depth, and
the limit.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

__all__ = [
    "MAX_DEPTH", "MAX_CONFIG_BYTES", "MAX_TOKENIZER_BYTES", "UntrustedInputError",
    "MAX_YAML_NODES", "read_untrusted_bytes", "read_json_file", "parse_json", "parse_yaml", "check_depth",
    "check_regular_file",
]

MAX_DEPTH = 64  # real configs, markers and tokenizer files nest under 10 deep
MAX_CONFIG_BYTES = 16 * 1024 * 1024  # configs, markers, labels: a few KB (a 1000-class id2label is ~40 KB)
MAX_TOKENIZER_BYTES = 256 * 1024 * 1024  # tokenizer.json of large vocabularies: tens of MB
MAX_YAML_NODES = 100_000  # values a YAML config may expand to through its aliases (a recipe has ~100)


class UntrustedInputError(ValueError):
    """An untrusted file or value is not what it should be (too large, too deep, not a regular file, not JSON)."""


def check_regular_file(path: str | os.PathLike[str], what: str = "file") -> Path:
    """``path`` if it is a regular file (symlinks followed); ``FileNotFoundError`` when absent,
    ``UntrustedInputError`` for a directory, FIFO, socket or device."""
    file = Path(path)
    try:
        mode = file.stat().st_mode
    except FileNotFoundError:
        raise FileNotFoundError(f"no such {what}: {file}") from None
    if not stat.S_ISREG(mode):
        raise _not_regular(file, what, mode)
    return file


def read_untrusted_bytes(path: str | os.PathLike[str], *, max_bytes: int = MAX_CONFIG_BYTES, what: str = "file") -> bytes:
    """The bytes of the regular file ``path``, refused unread when it is larger than ``max_bytes``."""
    file = check_regular_file(path, what)
    # O_NONBLOCK: a file swapped for a FIFO after the check still cannot block the open.
    fd = os.open(file, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise _not_regular(file, what, st.st_mode)
        if st.st_size > max_bytes:
            raise UntrustedInputError(f"{file}: the {what} is {st.st_size} bytes, over the limit of {max_bytes} bytes (not read)")
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:  # it grew while being read
        raise UntrustedInputError(f"{file}: the {what} is over the limit of {max_bytes} bytes (not read whole)")
    return data


def parse_json(data: bytes | str, source: str, *, max_depth: int = MAX_DEPTH) -> Any:
    """Parse JSON ``data``, refusing one nested deeper than ``max_depth``; errors name ``source``."""
    try:  # the decoder recurses once per level: past Python's limit it raises, in linear time
        value = json.loads(data)
    except RecursionError:
        raise UntrustedInputError(f"{source}: nested too deeply to parse (the limit is {max_depth} levels)") from None
    except (UnicodeDecodeError, ValueError) as e:
        raise UntrustedInputError(f"{source}: invalid JSON ({e})") from None
    check_depth(value, source, max_depth=max_depth)
    return value


def read_json_file(
    path: str | os.PathLike[str], *, what: str = "JSON file", max_bytes: int = MAX_CONFIG_BYTES, max_depth: int = MAX_DEPTH,
    expect: type | None = None,
) -> Any:
    """The JSON value of the untrusted file ``path``: a regular file, at most ``max_bytes``, nested at
    most ``max_depth`` deep, and (``expect``) of that type (``dict`` for a JSON object)."""
    value = parse_json(read_untrusted_bytes(path, max_bytes=max_bytes, what=what), str(path), max_depth=max_depth)
    if expect is not None and not isinstance(value, expect):
        names: dict[type, str] = {dict: "a JSON object", list: "a JSON array", str: "a JSON string"}
        raise UntrustedInputError(f"{path}: expected {names.get(expect, expect.__name__)}, got {type(value).__name__} (the {what})")
    return value


def parse_yaml(text: str, source: str | None, *, loader: type, max_depth: int = MAX_DEPTH, max_nodes: int = MAX_YAML_NODES) -> Any:
    """Parse YAML ``text`` with ``loader`` (a ``yaml.SafeLoader`` subclass), refusing a document nested
    deeper than ``max_depth`` or whose aliases expand to more than ``max_nodes`` values (a "billion
    laughs"); ``ValueError`` naming ``source`` (the file; ``None``: the text itself) for invalid YAML."""
    import yaml

    label = source if source is not None else _short(text)
    if _flow_depth(text) > max_depth:  # before PyYAML, whose scanner is quadratic in the nesting depth
        raise UntrustedInputError(f"{label}: nested more than {max_depth} levels deep (the limit; not parsed)")
    try:
        value = yaml.load(text, Loader=loader)  # noqa: S506 -- the callers pass SafeLoader subclasses
    except RecursionError:
        raise UntrustedInputError(f"{label}: nested too deeply to parse (the limit is {max_depth} levels)") from None
    except yaml.YAMLError as e:
        raise ValueError(f"{source}: cannot parse as YAML: {e}" if source else f"cannot parse {label} as YAML: {e}") from None
    check_depth(value, label, max_depth=max_depth, max_nodes=max_nodes)
    return value


def check_depth(value: Any, source: str, *, max_depth: int = MAX_DEPTH, max_nodes: int | None = None) -> None:
    """Refuse a parsed value (dicts and lists) nested deeper than ``max_depth``, or (``max_nodes``) holding
    more values than that counted with repeats (YAML aliases); walks without recursion."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    visited = 0
    while stack:
        item, depth = stack.pop()
        visited += 1
        if max_nodes is not None and visited > max_nodes:
            raise UntrustedInputError(f"{source}: expands to more than {max_nodes} values (aliases repeated?), the limit")
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        if depth > max_depth:
            raise UntrustedInputError(f"{source}: nested more than {max_depth} levels deep (the limit)")
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))


def _flow_depth(text: str) -> int:
    """The deepest nesting of YAML flow brackets (``[`` ``{``) outside quoted strings and comments; cheap
    when there are few brackets (a config), linear otherwise."""
    if text.count("[") + text.count("{") <= MAX_DEPTH:
        return 0
    import re

    import numpy as np

    plain = re.sub(r"'[^']*'|\"(?:[^\"\\\n]|\\.)*\"|#[^\n]*", "", text)  # '' inside '...' splits it in two: harmless
    codes = np.frombuffer(plain.encode("utf-8", "surrogatepass"), dtype=np.uint8)
    steps = np.zeros(len(codes), dtype=np.int32)
    steps[(codes == ord("[")) | (codes == ord("{"))] = 1
    steps[(codes == ord("]")) | (codes == ord("}"))] = -1
    return int(np.cumsum(steps).max()) if len(steps) else 0


def _short(text: str, limit: int = 80) -> str:
    shown = repr(text)
    return shown if len(shown) <= limit else shown[: limit - 3] + "..."


def _not_regular(file: Path, what: str, mode: int) -> UntrustedInputError:
    return UntrustedInputError(f"{file}: the {what} is not a regular file ({_kind(mode)}); refusing to read it")


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a plain file"
