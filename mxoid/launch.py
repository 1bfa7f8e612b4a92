"""``python -m mxoid.launch``: kept so that commands written for mxoid 0.1 still work.

``mxoid launch`` lives in :mod:`mxoid.distributed.launch` (``python -m
mxoid.distributed.launch``, or the ``mxoid launch`` command).
"""

import sys

from .distributed.launch import launch, main

__all__ = ["launch", "main"]

if __name__ == "__main__":
    sys.exit(main())
