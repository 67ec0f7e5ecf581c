"""Directory to directory: a Hugging Face model directory <-> an aiayn model directory (``aiayn.pretrained``).

The aiayn side also gets ``hf_source.json`` (the original ``config.json``, the class name, the
dropped keys and why there is no tokenizer), so exporting it again keeps the token ids and label
names that our configs have no field for.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from aiayn.checkpoint.atomic_io import replace_directory
from aiayn.interop.hf import Exported, Imported, load_hf, save_hf
from aiayn.interop.hf_dir import CONFIG_FILE
from aiayn.pretrained import check_replaceable, hf_source_config, load_pretrained, save_pretrained
from aiayn.untrusted import read_json_file

__all__ = ["convert_from_hf", "convert_to_hf", "SOURCE_FILE"]

log = logging.getLogger(__name__)

SOURCE_FILE = "hf_source.json"


def convert_from_hf(
    hf_dir: str | Path, out_dir: str | Path, *, architecture: str | None = None, overwrite: bool = False
) -> Imported:
    """Read the Hugging Face directory ``hf_dir``, write an aiayn model directory ``out_dir``.

    The tokenizer comes along only if ``tokenizer.json`` is in aiayn's special-token layout
    (``Imported.tokenizer_note`` says why not). Raises what :func:`~aiayn.interop.load_hf` raises,
    ``FileExistsError`` if ``out_dir`` exists and not ``overwrite``, and ``ValueError`` when
    ``hf_dir`` is an aiayn directory.
    """
    _refuse_wrong_side(Path(hf_dir), expect="hf")
    imported = load_hf(hf_dir, architecture=architecture)
    source = {
        "architecture": imported.architecture, "config": imported.hf_config, "dropped": imported.dropped,
        "tokenizer_note": imported.tokenizer_note, "from": str(Path(hf_dir).resolve()),
    }
    record = (json.dumps(source, indent=2, sort_keys=True, default=str) + "\n").encode()
    save_pretrained(out_dir, imported.model, imported.tokenizer, imported.tgt_tokenizer, overwrite=overwrite,
                    extra_files={SOURCE_FILE: record})  # inside the atomic write, listed in its manifest
    return imported


def convert_to_hf(
    our_dir: str | Path, hf_dir: str | Path, *, architecture: str | None = None, overwrite: bool = False
) -> tuple[Exported, str | None]:
    """Read the aiayn model directory ``our_dir``, write a Hugging Face directory ``hf_dir``.

    Returns the export and why no tokenizer was written (``None`` if one was). Raises
    ``FileExistsError`` if ``hf_dir`` exists and not ``overwrite``, ``ConfigError`` naming the field
    no supported class can hold.
    """
    _refuse_wrong_side(Path(our_dir), expect="aiayn")
    target = Path(hf_dir)
    if target.exists() and not overwrite:
        raise FileExistsError(f"{target} exists; pass overwrite=True (--overwrite) to replace it")
    previous = check_replaceable(target)  # only a previous export's files, never someone's notes
    loaded = load_pretrained(our_dir, pack=False)  # exported, never run
    extras = hf_source_config(loaded.path)
    tokenizer, note = loaded.src_tokenizer, None
    if tokenizer is None:
        note = "the aiayn directory holds no tokenizer"
    elif loaded.tgt_tokenizer is not tokenizer:
        tokenizer, note = None, "source and target tokenizers differ; a Hugging Face directory holds one tokenizer.json"
    with replace_directory(target, previous=previous) as tmp:
        exported = save_hf(tmp, loaded.model, tokenizer=tokenizer, architecture=architecture, hf_extras=extras)
        if tokenizer is not None and not (tmp / "tokenizer.json").is_file():
            note = f"a {type(tokenizer).__name__} has no tokenizer.json form"
    return exported, note


def _refuse_wrong_side(directory: Path, *, expect: str) -> None:
    """A clear error when the two kinds of directory (both with a config.json) are swapped."""
    file = directory / CONFIG_FILE
    if not file.is_file():
        return
    try:
        config = read_json_file(file, what="model config", expect=dict)
    except ValueError:
        return  # the reader of that side names what is wrong with it
    if expect == "hf" and "family" in config and "architectures" not in config:
        raise ValueError(f"{directory} is an aiayn model directory, not a Hugging Face one: export it with --to-hf DIR --from {directory}")
    if expect == "aiayn" and "architectures" in config and "family" not in config:
        raise ValueError(f"{directory} is a Hugging Face model directory: import it with --from-hf {directory} --to DIR")
