"""``python -m mxoid``: the ``mxoid`` command (see :mod:`mxoid.cli`)."""

import sys

from .cli import main

sys.exit(main())
