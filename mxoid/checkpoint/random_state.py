"""NumPy's and Python's global random states, as plain data a checkpoint can hold.

MXNet's own generator cannot be read back in MXNet 1.x; the checkpoint
reseeds it instead (see :class:`~mxoid.extensions.Checkpoint`).
"""

from __future__ import annotations

import random
import threading
from typing import Any, Dict, Optional

import numpy as np

__all__ = [
    "RANDOM_STATE_LOCK",
    "check_random_states",
    "get_random_states",
    "seed_everything",
    "set_random_states",
]

RANDOM_STATE_LOCK = threading.RLock()
"""Held while the global states are read, set or swapped: a DataLoader's sample loaded on
another thread (``Prefetch``, a thread pool) with a seed of its own gives them back before a
checkpoint reads them (:mod:`mxoid.data.sampling`)."""


def get_random_states() -> Dict[str, Any]:
    """Return NumPy's and Python's global random states as plain (JSON-ready) data."""
    with RANDOM_STATE_LOCK:
        name, keys, pos, has_gauss, cached = np.random.get_state()
        version, internal, gauss_next = random.getstate()
    return {
        "numpy": [name, keys.tolist(), int(pos), int(has_gauss), float(cached)],
        "python": [version, list(internal), gauss_next],
    }


def set_random_states(state: Dict[str, Any]) -> None:
    """Restore the states returned by :func:`get_random_states`."""
    name, keys, pos, has_gauss, cached = state["numpy"]
    version, internal, gauss_next = state["python"]
    with RANDOM_STATE_LOCK:
        np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
        random.setstate((version, tuple(internal), gauss_next))


def check_random_states(state: Any) -> Optional[str]:
    """Return what is wrong with ``state`` as :func:`get_random_states` returns it; None if nothing.

    The states are tried on generators of their own, so the global ones are
    left as they are.
    """
    if not isinstance(state, dict) or "numpy" not in state or "python" not in state:
        return "not a dict with the 'numpy' and 'python' states"
    try:
        name, keys, pos, has_gauss, cached = state["numpy"]
        if len(keys) != 624 or not isinstance(pos, int) or not 0 <= pos <= 624:
            return "its 'numpy' state is not MT19937's: 624 keys and a position up to 624"
        np.random.RandomState().set_state(
            (name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached)
        )
    except Exception as error:  # NumPy raises many kinds for a malformed state
        return f"its 'numpy' state does not load ({type(error).__name__}: {error})"
    try:
        version, internal, gauss_next = state["python"]
        random.Random().setstate((version, tuple(internal), gauss_next))
    except Exception as error:
        return f"its 'python' state does not load ({type(error).__name__}: {error})"
    return None


def seed_everything(seed: int) -> None:
    """Seed NumPy's, Python's and MXNet's random generators (every device's) with ``seed``.

    Call it before building the iterators and the loop: NumPy seeds an
    ``NDArrayIter``'s shuffle, MXNet the initializers and Dropout masks.
    """
    import mxnet as mx

    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be an int >= 0, got {seed!r}")
    with RANDOM_STATE_LOCK:
        np.random.seed(seed)
        random.seed(seed)
        mx.random.seed(seed)
