"""A worker that fails anywhere in its script exits, instead of waiting for the others.

A worker process that created a distributed kvstore waits, at interpreter
exit, in ps-lite's finalize barrier for every other worker, which never
come when it failed: an exception raised after ``mx.kv.create`` and before
``MainLoop(...)`` (loading data, say) hung the job until ``--timeout``.
:class:`~mxoid.MainLoop` already ends a failed worker with
:func:`mxoid.distributed.exit_after_error`; :func:`install_worker_exit_hooks`
does the same for the rest of the script. In a process with
``DMLC_ROLE=worker`` (what ``mxoid launch`` starts), importing
:mod:`mxoid.distributed` (which ``from mxoid import MainLoop`` does) installs:

- a ``sys.excepthook``: an uncaught exception (``KeyboardInterrupt`` too)
  is printed with its traceback, then the process ends with status 1 (130);
- a wrapper of ``sys.exit`` and an ``atexit`` handler: ``sys.exit(code)``
  with a failure code ends the process with that code.

Both act only while a distributed kvstore exists; otherwise the process
exits as Python would. The launcher sees the failed worker's status and
stops the others. This module does not import MXNet.
"""

from __future__ import annotations

import atexit
import gc
import sys
from types import TracebackType
from typing import Any, List, Optional

__all__ = ["install_worker_exit_hooks"]

_installed = False
_exit_codes: List[Any] = []  # what sys.exit was called with, last first


def _distributed_rank() -> Optional[int]:
    """Return the rank of a live distributed kvstore of this process, or None without one."""
    module = sys.modules.get("mxnet.kvstore")
    kind = getattr(module, "KVStore", None)
    if kind is None:
        return None
    for candidate in gc.get_objects():
        try:
            if isinstance(candidate, kind) and "dist" in candidate.type:
                return int(candidate.rank)
        except Exception:  # a kvstore being freed
            continue
    return None


def _excepthook(
    kind: type, error: BaseException, traceback: Optional[TracebackType], previous: Any
) -> None:
    rank = _distributed_rank()
    if rank is None:
        previous(kind, error, traceback)
        return
    from .workers import exit_after_error

    exit_after_error(error.with_traceback(traceback), rank, during="in its script")


def _at_exit() -> None:
    if not _exit_codes:
        return
    code = _exit_codes[0]
    if code is None or code == 0:
        return
    rank = _distributed_rank()
    if rank is not None:
        from .workers import exit_after_error

        exit_after_error(SystemExit(code), rank, during="in its script")


def install_worker_exit_hooks() -> None:
    """Install the hooks described in the module's documentation (once per process)."""
    global _installed
    if _installed:
        return
    _installed = True
    previous_hook = sys.excepthook
    sys.excepthook = lambda kind, error, traceback: _excepthook(
        kind, error, traceback, previous_hook
    )
    python_exit = sys.exit

    def exit(status: object = None) -> None:
        _exit_codes.insert(0, status)
        python_exit(status)

    exit.__doc__ = python_exit.__doc__
    sys.exit = exit  # type: ignore[assignment]
    atexit.register(_at_exit)
