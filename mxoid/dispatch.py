"""Dispatching hooks to extensions, with per-extension time accounting."""
from __future__ import annotations

import functools
from time import perf_counter
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from .extensions.base import HOOKS, Extension

__all__ = ["HookDispatcher", "HookTimes"]


class HookTimes:
    """Calls and seconds spent by one extension in one hook."""

    __slots__ = ("extension", "hook", "method", "calls", "seconds")

    def __init__(self, extension: Extension, hook: str) -> None:
        self.extension = extension
        self.hook = hook
        self.method: Callable[..., None] = getattr(extension, hook)
        self.calls = 0
        self.seconds = 0.0


class HookDispatcher:
    """Calls each hook on the extensions that handle it, in a fixed order.

    Extensions are sorted by ascending ``priority``, ties kept in list
    order. A hook reaches only the extensions whose :meth:`Extension.handles`
    is true for it, so a hook nobody handles costs one empty loop.

    Parameters
    ----------
    extensions : sequence of Extension
    rank : int, default 0
        This worker's rank: extensions with ``rank_zero_only`` are left out
        on other ranks.
    """

    def __init__(self, extensions: Sequence[Extension], rank: int = 0) -> None:
        self.extensions: List[Extension] = sorted(
            (e for e in extensions if rank == 0 or not e.rank_zero_only), key=lambda e: e.priority)
        self.handlers: Dict[str, List[HookTimes]] = {
            hook: [HookTimes(e, hook) for e in self.extensions if e.handles(hook)] for hook in HOOKS}

    def fire(self, hook: str, *args: Any) -> None:
        """Run ``hook`` on its extensions; an error is re-raised with the extension and hook noted."""
        for handler in self.handlers[hook]:
            start = perf_counter()
            try:
                handler.method(*args)
            except BaseException as error:
                handler.seconds += perf_counter() - start
                _note_origin(error, handler)
                raise
            handler.seconds += perf_counter() - start
            handler.calls += 1

    def runner(self, hook: str) -> Optional[Callable[..., None]]:
        """Return a callable firing ``hook``, or None when no extension handles it."""
        if not self.handlers[hook]:
            return None
        return functools.partial(self.fire, hook)

    def profile(self) -> List[Tuple[str, str, int, float]]:
        """Return ``(extension name, hook, calls, seconds)`` for every dispatched pair, slowest first."""
        rows = [(h.extension.name, h.hook, h.calls, h.seconds)
                for handlers in self.handlers.values() for h in handlers]
        return sorted(rows, key=lambda row: -row[3])


def _note_origin(error: BaseException, handler: HookTimes) -> None:
    if getattr(error, "mxoid_origin", None) is None:
        error.mxoid_origin = (handler.extension.name, handler.hook)
        if hasattr(error, "add_note"):
            error.add_note(f"raised in extension {handler.extension.name!r} "
                           f"during its {handler.hook} hook")
