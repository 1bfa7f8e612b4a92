"""Dispatching hooks to extensions, and the extensions' states in checkpoints.

The time spent in each hook is accounted per extension.
"""

from __future__ import annotations

import functools
import logging
import os
from time import perf_counter
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from .base import HOOKS, Extension

__all__ = ["NOTHING_STOPS", "HookDispatcher", "HookTimes", "check_extensions"]

logger = logging.getLogger(__name__)

NOTHING_STOPS = (
    "nothing can stop this loop: none of its extensions requests a stop. Add "
    "FinishAfter(after_n_epochs=...) (or EarlyStopping, NaNGuard...), or set "
    "stops_training = True on your own extension that calls main_loop.request_stop()"
)


def check_extensions(extensions: Any) -> List[Extension]:
    """Return ``extensions`` as a list, or raise saying what is wrong with it.

    Raises
    ------
    TypeError
        For something that is not a list of extensions (a single one included).
    ValueError
        When no extension can stop training, or two write the same file or directory.
    """
    if isinstance(extensions, Extension):
        raise TypeError(
            f"extensions must be a list of extensions; got a single "
            f"{type(extensions).__name__}: pass extensions=[{extensions.name}(...)]"
        )
    if isinstance(extensions, (str, bytes)) or not hasattr(extensions, "__iter__"):
        raise TypeError(
            f"extensions must be a list of mxoid.Extension objects, not {type(extensions).__name__}"
        )
    extensions = list(extensions)
    for extension in extensions:
        if not isinstance(extension, Extension):
            raise TypeError(
                f"extensions must be mxoid.Extension instances; got "
                f"{type(extension).__name__} ({extension!r})"
            )
    if not any(extension.stops_training for extension in extensions):
        raise ValueError(NOTHING_STOPS)
    for attribute, what in (("path", "log file"), ("directory", "checkpoint directory")):
        seen: Dict[str, Extension] = {}
        for extension in extensions:
            value = getattr(extension, attribute, None)
            if not isinstance(value, str):
                continue
            key = os.path.abspath(value)
            if key in seen:
                raise ValueError(
                    f"{seen[key].name} and {extension.name} both write the "
                    f"{what} {value}: they would overwrite each other; give each "
                    "its own"
                )
            seen[key] = extension
    return extensions


class HookTimes:
    """Calls and seconds spent by one extension in one hook, and how to call it.

    ``method`` runs the extension's own hook method when its class overrides
    it, then its firing conditions if that method did not fire them (through
    ``super()``); or just the conditions.
    """

    __slots__ = ("extension", "hook", "method", "calls", "seconds")

    def __init__(self, extension: Extension, hook: str) -> None:
        self.extension = extension
        self.hook = hook
        overridden = extension.overrides(hook)
        conditions = hook in extension.conditions
        if overridden and conditions:
            self.method: Callable[..., None] = functools.partial(
                _hook_and_conditions, extension, hook
            )
        elif overridden:
            self.method = getattr(extension, hook)
        else:
            self.method = functools.partial(extension.fire_conditions, hook)
        self.calls = 0
        self.seconds = 0.0


def _hook_and_conditions(extension: Extension, hook: str, *args: Any) -> None:
    extension._conditions_fired = False
    getattr(extension, hook)(*args)
    if not extension._conditions_fired:
        extension.fire_conditions(hook, *args)


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

    Attributes
    ----------
    all_extensions : list of Extension
        Every extension of the loop, in the order given.
    extensions : list of Extension
        Those this worker runs, in the order they run.
    """

    def __init__(self, extensions: Sequence[Extension], rank: int = 0) -> None:
        self.all_extensions = list(extensions)
        self.extensions: List[Extension] = sorted(
            (e for e in self.all_extensions if rank == 0 or not e.rank_zero_only),
            key=lambda e: e.priority,
        )
        self.handlers: Dict[str, List[HookTimes]] = {
            hook: [HookTimes(e, hook) for e in self.extensions if e.handles(hook)] for hook in HOOKS
        }

    def fire(self, hook: str, *args: Any) -> None:
        """Run ``hook`` on its extensions.

        An error is re-raised with the extension and hook noted.
        """
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

    def fire_on_error(self, error: BaseException) -> None:
        """Run the ``on_error`` hooks; one that fails is logged, never hides ``error``."""
        for handler in self.handlers["on_error"]:
            try:
                handler.method(error)
            except Exception as secondary:
                logger.error("on_error of %r failed: %s", handler.extension.name, secondary)

    def profile(self) -> List[Tuple[str, str, int, float]]:
        """Return ``(extension name, hook, calls, seconds)`` for every dispatched pair.

        The slowest come first.
        """
        rows = [
            (h.extension.name, h.hook, h.calls, h.seconds)
            for handlers in self.handlers.values()
            for h in handlers
        ]
        return sorted(rows, key=lambda row: -row[3])

    # ------------------------------------------------------------- states
    def keyed(self) -> Dict[str, Extension]:
        """Every extension by a key unique in the loop: its name, then ``name#2``... for repeats."""
        keys: Dict[str, Extension] = {}
        for extension in self.all_extensions:
            key, count = extension.name, 1
            while key in keys:
                count += 1
                key = f"{extension.name}#{count}"
            keys[key] = extension
        return keys

    def state_dict(self) -> Dict[str, Any]:
        """Every extension's ``state_dict()``, by :meth:`keyed` key."""
        return {key: extension.state_dict() for key, extension in self.keyed().items()}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Give each extension its state from :meth:`state_dict` (matched by key).

        Raises
        ------
        ValueError
            Naming the extension whose state does not load.
        """
        for key, extension in self.keyed().items():
            if key in state:
                try:
                    extension.load_state_dict(state[key])
                except (KeyError, TypeError, ValueError, AttributeError) as error:
                    raise ValueError(
                        f"the state of extension {key!r} does not load "
                        f"({type(error).__name__}: {error})"
                    ) from None


def _note_origin(error: BaseException, handler: HookTimes) -> None:
    if getattr(error, "mxoid_origin", None) is None:
        error.mxoid_origin = (handler.extension.name, handler.hook)
        if hasattr(error, "add_note"):
            error.add_note(
                f"raised in extension {handler.extension.name!r} during its {handler.hook} hook"
            )
