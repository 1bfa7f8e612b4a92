"""Input pipelines around MXNet's data iterators.

:class:`Prefetch` reads the next batches of an iterator on a background thread
while the devices compute, and keeps exact resumption. :class:`DataLoaderIter`
reads a Gluon ``DataLoader`` as an ``mx.io.DataIter``, resumable mid-epoch
exactly, its random augmentation seeded once a batch; :func:`as_data_iter` takes
either.
"""

from .loader import DataLoaderIter, as_data_iter
from .prefetch import Prefetch

__all__ = ["DataLoaderIter", "Prefetch", "as_data_iter"]
