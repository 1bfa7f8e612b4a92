"""Input pipelines around MXNet's data iterators.

:class:`Prefetch` reads the next batches of an iterator on a background thread
while the devices compute, and keeps exact resumption.
"""

from .prefetch import Prefetch

__all__ = ["Prefetch"]
