"""A loaded model's weights on transparent huge pages (2 MiB) rather than the 4 KiB pages ``malloc`` gives them.

Why: batch-1 decoding reads every weight once a token, so it runs at the speed memory streams. With 4 KiB pages the
stream crosses a page every 4 KiB: a TLB miss, and a stop for the hardware prefetcher, which does not cross pages. On
an AMX Xeon one token's weight reads of GPT-2 small through our kernel ran 1.07x (fp32), 1.13x (bf16) and 1.20x (int8)
faster from huge pages, whole greedy decoding 1.00-1.08x (``docs/benchmarks.md``). Linux gives huge pages to memory advised with
``MADV_HUGEPAGE`` where ``/sys/kernel/mm/transparent_hugepage/enabled`` is ``madvise`` or ``always``.

:func:`place_on_huge_pages` copies a module's parameters and buffers into one anonymous mapping advised so, each
tensor its own storage inside it (``torch.frombuffer``: separate data pointers, so checkpoints and safetensors see
separate tensors), and points each tensor at its copy with ``tensor.data = copy``: the same Parameter and buffer
objects, tied weights still tied, values and versions unchanged. Whether it pays is timed on the machine
(:func:`aiayn.inference.kernel_choice.choose_huge_pages`); ``$AIAYN_HUGE_PAGES`` overrides.
"""

from __future__ import annotations

import mmap
import sys
import weakref
from pathlib import Path
from typing import Iterable, Iterator

import torch
from torch import Tensor, nn

__all__ = ["ENV_VAR", "HUGE_PAGE", "MODES", "huge_page_bytes", "huge_page_copies", "on_huge_pages", "place_on_huge_pages", "unavailable_reason"]

ENV_VAR = "AIAYN_HUGE_PAGES"
MODES = ("measure", "on", "off")  # measure: timed once per machine and cached; on, off: forced
HUGE_PAGE = 2 << 20  # x86-64's transparent huge page
ALIGN = 64  # each tensor's start: a cache line (the kernels' vector loads)
SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")

_ARENAS: list[tuple[int, int, weakref.ref]] = []  # (start, end, the mapping) of each live arena, for on_huge_pages


def unavailable_reason() -> str | None:
    """Why weights cannot go on transparent huge pages here (a phrase), or ``None`` where they can."""
    if not sys.platform.startswith("linux") or not hasattr(mmap, "MADV_HUGEPAGE"):
        return f"transparent huge pages are Linux's (this is {sys.platform})"
    try:
        setting = SETTING.read_text()
    except OSError as err:
        return f"cannot read {SETTING} ({err.strerror})"
    if "[never]" in setting:
        return f"transparent huge pages are off on this machine ({SETTING}: {setting.strip()})"
    return None


def huge_page_copies(tensors: Iterable[Tensor]) -> list[Tensor]:
    """Copies of contiguous CPU ``tensors`` (same dtypes, shapes and values) in one anonymous mapping advised for
    transparent huge pages, each at a cache-line boundary and with a storage of its own."""
    return list(_copies(list(tensors)))


def _copies(tensors: list[Tensor]) -> Iterator[Tensor]:
    """:func:`huge_page_copies`, one at a time (a caller that drops each original as it goes holds one extra tensor)."""
    sizes = [t.numel() * t.element_size() for t in tensors]
    offsets, total = [], 0
    for size in sizes:
        offsets.append(total)
        total += -(-max(size, 1) // ALIGN) * ALIGN
    if not tensors:
        return
    arena = mmap.mmap(-1, total + HUGE_PAGE, flags=mmap.MAP_PRIVATE)  # anonymous; private: shared memory has its own setting
    whole = torch.frombuffer(arena, dtype=torch.uint8)
    skip = -whole.data_ptr() % HUGE_PAGE  # huge pages map 2 MiB-aligned addresses: start the tensors at one
    arena.madvise(mmap.MADV_HUGEPAGE, skip, total)  # before the first write: the pages are made huge as they are touched
    _ARENAS.append((whole.data_ptr() + skip, whole.data_ptr() + skip + total, weakref.ref(arena)))
    del whole
    for t, size, offset in zip(tensors, sizes, offsets):
        flat = torch.frombuffer(arena, dtype=torch.uint8, count=size, offset=skip + offset) if size else torch.empty(0, dtype=torch.uint8)
        copy = flat.view(t.dtype).view(t.shape)
        copy.copy_(t)
        yield copy


def on_huge_pages(t: Tensor) -> bool:
    """Whether ``t``'s data lies in a mapping :func:`huge_page_copies` made (advised for huge pages)."""
    _ARENAS[:] = [a for a in _ARENAS if a[2]() is not None]
    return any(start <= t.data_ptr() < end for start, end, _ in _ARENAS)


def huge_page_bytes(t: Tensor) -> int | None:
    """The bytes of huge pages the system gave the mapping that holds ``t`` (its ``AnonHugePages`` in
    ``/proc/self/smaps``: it may give none, with its memory fragmented), or ``None`` where that cannot be read."""
    address = t.data_ptr()
    try:
        with open("/proc/self/smaps") as smaps:
            inside = False
            for line in smaps:
                head = line.split(maxsplit=1)[0] if line.strip() else ""
                if "-" in head and not head.endswith(":"):  # a mapping's first line: "start-end perms ..."
                    start, end = (int(x, 16) for x in head.split("-"))
                    inside = start <= address < end
                elif inside and head == "AnonHugePages:":
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None


def place_on_huge_pages(module: nn.Module) -> int:
    """Point ``module``'s parameters and buffers at copies on huge pages (:func:`huge_page_copies`), in place (``t.data
    = copy``: the same objects); returns the bytes moved. Each tensor moved is dense, on the CPU and the whole of its
    storage, which no other of them shares (a view of another weight keeps its place, and its link); one already
    placed stays."""
    seen: dict[int, list[Tensor]] = {}
    for t in [*module.parameters(), *module.buffers()]:
        if t.device.type == "cpu" and t.layout == torch.strided and not t.is_quantized and t.numel():
            seen.setdefault(t.untyped_storage().data_ptr(), []).append(t)
    movable = []
    for group in seen.values():
        t = group[0]
        whole = t.is_contiguous() and t.storage_offset() == 0 and t.untyped_storage().nbytes() == t.numel() * t.element_size()
        if whole and all(other is t for other in group) and not on_huge_pages(t):
            movable.append(t)
    with torch.no_grad():
        for t, copy in zip(movable, _copies(movable)):
            t.data = copy  # the old memory goes now, not after all are copied
    return sum(t.numel() * t.element_size() for t in movable)
