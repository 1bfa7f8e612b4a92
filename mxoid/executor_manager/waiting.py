"""Waiting for MXNet's engine where a signal can interrupt the wait.

Python runs a signal handler in the main thread, between two of its
instructions: while the main thread is inside MXNet's ``WaitAll`` or
``WaitToRead`` (seconds, on a host many batches ahead of its devices), a
Ctrl-C is neither acknowledged nor counted, and a second one sent meanwhile is
lost (Python keeps one pending flag per signal number). :func:`wait_for` has a
thread of its own do MXNet's wait, while the main thread waits on an event: a
wait that signals interrupt, after which Python runs the handler at once and
the main thread goes on waiting.
"""

from __future__ import annotations

import queue
import threading
from typing import Callable, Optional, Tuple

__all__ = ["wait_for"]

_requests: queue.SimpleQueue[Tuple[Callable[[], None], threading.Event, list]] = queue.SimpleQueue()
_lock = threading.Lock()
_waiter: Optional[threading.Thread] = None


def _serve() -> None:
    while True:
        wait, done, failure = _requests.get()
        try:
            wait()
        except BaseException as error:  # handed to the thread that asked
            failure.append(error)
        finally:
            done.set()


def wait_for(wait: Callable[[], None]) -> None:
    """Run ``wait`` (a call that blocks in MXNet) so that signals are handled meanwhile.

    In the main thread, ``wait`` runs on a waiter thread and the main thread
    waits for it, handling signals as they come (a handler that raises, the
    third Ctrl-C's ``KeyboardInterrupt``, ends the wait at once; MXNet's wait
    finishes on its own). Elsewhere ``wait`` is simply called.
    """
    global _waiter
    if threading.current_thread() is not threading.main_thread():
        wait()
        return
    with _lock:
        if _waiter is None or not _waiter.is_alive():
            _waiter = threading.Thread(target=_serve, name="mxoid-engine-wait", daemon=True)
            _waiter.start()
    done, failure = threading.Event(), []
    _requests.put((wait, done, failure))
    done.wait()
    if failure:
        raise failure[0]
