"""How an evaluation reads an iterator: every sentence once, off the training run's generators.

:meth:`mxoid.MainLoop.score`, :meth:`~mxoid.MainLoop.predict` and
:class:`~mxoid.extensions.Evaluate` read their iterators through
:func:`evaluation_iterator`:

- an ``mx.rnn.BucketSentenceIter`` is read from its own per-bucket arrays
  (:class:`~mxoid.data.sentences.SentencesInOrder`): every sentence once, in
  a fixed order, whatever its shuffles did, and without ever calling its
  ``reset()``, whose shuffles would draw from NumPy's and Python's global
  generators and leave out other sentences each time;
- any other iterator is read as it yields, each ``reset()`` and batch inside
  :func:`random_states_kept`: what it draws from NumPy's and Python's
  global generators is given back, so that the training run draws what it
  would have drawn without the evaluation. (MXNet's own generator cannot be
  read back: an iterator that draws from it moves training; a forward pass
  with ``is_train=False`` draws nothing.)

Where such an iterator wraps a ``BucketSentenceIter`` (found by the attributes
``iterator``, ``data_iter``, ``source`` or ``base``), :func:`warn_left_out`
compares the sentences it yielded with those the wrapped iterator holds.
"""

from __future__ import annotations

import contextlib
import random
import warnings
from typing import Any, Iterator, Optional

import numpy as np

from ..checkpoint.random_state import RANDOM_STATE_LOCK
from .sentences import SentencesInOrder, is_bucket_sentence_iter

__all__ = ["evaluation_iterator", "random_states_kept", "sentences_held", "warn_left_out"]

WRAPPED = ("iterator", "data_iter", "source", "base")
LEFT_OUT = (
    "{what}: the iterator yielded {seen} of the {held} sentences of the BucketSentenceIter it "
    "wraps (that iterator leaves out each bucket's last partial batch, and which sentences "
    "those are changes with each of its shuffles), so the values are not about the whole set. "
    "Evaluate the BucketSentenceIter itself (mxoid reads every sentence of it once), or give "
    "the wrapper batches of every sentence"
)


def evaluation_iterator(iterator: Any) -> Any:
    """Return what an evaluation reads of ``iterator``: see the module's documentation."""
    if is_bucket_sentence_iter(iterator):
        return SentencesInOrder(iterator)
    return iterator


@contextlib.contextmanager
def random_states_kept() -> Iterator[None]:
    """Give NumPy's and Python's global generators back the states they had on entry."""
    with RANDOM_STATE_LOCK:
        numpy_state, python_state = np.random.get_state(), random.getstate()
    try:
        yield
    finally:
        with RANDOM_STATE_LOCK:
            np.random.set_state(numpy_state)
            random.setstate(python_state)


def sentences_held(iterator: Any) -> Optional[int]:
    """Return how many sentences the ``BucketSentenceIter`` that ``iterator`` wraps holds.

    None where ``iterator`` is read whole (:func:`evaluation_iterator`) or
    wraps none that mxoid can find.
    """
    seen = set()
    current = iterator
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if is_bucket_sentence_iter(current):
            if current is iterator:
                return None
            return int(sum(len(bucket) for bucket in current.data))
        current = next(
            (getattr(current, name) for name in WRAPPED if getattr(current, name, None)), None
        )
    return None


def warn_left_out(what: str, iterator: Any, seen: int) -> None:
    """Warn when ``iterator`` yielded fewer sentences (``seen``) than the one it wraps holds."""
    held = sentences_held(iterator)
    if held is not None and seen < held:
        warnings.warn(LEFT_OUT.format(what=what, seen=seen, held=held), stacklevel=3)
