"""``python -m aiayn`` (and ``torchrun -m aiayn``) runs the command line, with the allocator of :mod:`aiayn.allocator`."""

import sys

from aiayn.cli.launch import main

sys.exit(main())
