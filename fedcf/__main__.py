"""``python -m fedcf``: the command line (see ``fedcf --help``)."""

import sys

from .cli import main

sys.exit(main())
