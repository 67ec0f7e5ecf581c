"""The ``aiayn`` command's entry point: the allocator first (:mod:`aiayn.allocator`: a re-execution with
mimalloc preloaded, before torch loads), then the command line (:func:`aiayn.cli.main.main`)."""

from __future__ import annotations

import sys

from aiayn.allocator import reexec_with_allocator


def main() -> int:
    try:
        reexec_with_allocator()
    except (ValueError, RuntimeError) as e:  # a bad $AIAYN_ALLOCATOR: said as the command's other errors are
        print(f"aiayn: error: {e}", file=sys.stderr)
        return 2
    from aiayn.cli.main import main as run_command_line

    return run_command_line()
