"""``python -m aiayn`` (and ``torchrun -m aiayn``) runs the command line."""

import sys

from aiayn.cli.main import main

sys.exit(main())
