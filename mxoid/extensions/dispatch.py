"""Dispatching hooks to extensions, and the extensions' states in checkpoints.

The time spent in each hook is accounted per extension.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import logging
import os
from time import perf_counter
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from .base import HOOK_ARGUMENTS, HOOKS, Extension

__all__ = [
    "FOREIGN_HOOKS",
    "NOTHING_STOPS",
    "HookDispatcher",
    "HookTimes",
    "check_extension",
    "check_extensions",
    "check_record_names",
]

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
        check_extension(extension)
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


NO_SUPER_INIT = (
    "{cls}.__init__ did not call super().__init__(): call it, passing the firing keywords "
    "(every_n_epochs=..., after_epoch=True, ...), name and priority on to Extension"
)
LOOKS_LIKE_A_HOOK = (
    "{cls}.{method} is not a hook, so the loop never calls it; did you mean {hook}? "
    "(The hooks are {hooks}; a method of your own that is not a hook reads better "
    "without a hook's before_/after_/on_ start, or starting with _.)"
)
WRONG_SIGNATURE = (
    "{cls}.{hook}{signature} cannot take what the loop passes: it calls "
    "{hook}({arguments}). Define it as def {hook}(self{parameters}):"
)
ANOTHER_LIBRARYS_HOOK = (
    "{cls}.{method} is a hook of {library}, not of mxoid, so the loop never calls it: "
    "name it {hook}{note}. (The hooks are {hooks}.)"
)
_AFTER_EVALUATE = " (at a priority above the Evaluate's, to read its records)"
FOREIGN_HOOKS: Dict[str, Tuple[str, str]] = {
    # Keras
    "on_train_begin": ("before_training", "Keras or Lightning"),
    "on_train_end": ("after_training", "Keras or Lightning"),
    "on_epoch_begin": ("before_epoch", "Keras"),
    "on_epoch_end": ("after_epoch", "Keras"),
    "on_batch_begin": ("before_batch", "Keras"),
    "on_batch_end": ("after_batch", "Keras"),
    "on_train_batch_begin": ("before_batch", "Keras"),
    "on_train_batch_end": ("after_batch", "Keras or Lightning"),
    "on_test_begin": ("after_epoch", "Keras"),
    "on_test_end": ("after_epoch", "Keras"),
    "on_test_batch_end": ("after_epoch", "Keras"),
    # Lightning
    "on_fit_start": ("before_training", "Lightning"),
    "on_fit_end": ("after_training", "Lightning"),
    "on_train_start": ("before_training", "Lightning"),
    "on_train_epoch_start": ("before_epoch", "Lightning"),
    "on_train_epoch_end": ("after_epoch", "Lightning"),
    "on_train_batch_start": ("before_batch", "Lightning"),
    "on_after_backward": ("after_backward", "Lightning"),
    "on_before_optimizer_step": ("before_update", "Lightning"),
    "on_before_zero_grad": ("after_update", "Lightning"),
    "on_validation_start": ("after_epoch", "Lightning"),
    "on_validation_end": ("after_epoch", "Lightning"),
    "on_validation_epoch_start": ("after_epoch", "Lightning"),
    "on_validation_epoch_end": ("after_epoch", "Lightning"),
    "on_validation_batch_end": ("after_epoch", "Lightning"),
    "on_exception": ("on_error", "Lightning"),
    "on_keyboard_interrupt": ("on_interrupt", "Lightning"),
    # Ignite's events, as methods
    "on_started": ("before_training", "Ignite (Events.STARTED)"),
    "on_epoch_started": ("before_epoch", "Ignite (Events.EPOCH_STARTED)"),
    "on_iteration_started": ("before_batch", "Ignite (Events.ITERATION_STARTED)"),
    "on_iteration_completed": ("after_batch", "Ignite (Events.ITERATION_COMPLETED)"),
    "on_epoch_completed": ("after_epoch", "Ignite (Events.EPOCH_COMPLETED)"),
    "on_completed": ("after_training", "Ignite (Events.COMPLETED)"),
    "on_exception_raised": ("on_error", "Ignite (Events.EXCEPTION_RAISED)"),
    "on_terminate": ("after_training", "Ignite (Events.TERMINATE)"),
    # Blocks' before_first_epoch, which mxoid calls before_training
    "before_first_epoch": ("before_training", "Blocks"),
}
"""Other libraries' hook names, and the mxoid hook to use instead (with the library named).

Evaluations are not hooks in mxoid: :class:`~mxoid.extensions.Evaluate` runs in
``after_epoch`` (or ``after_batch``) and writes records that later extensions read there."""
NO_DO = (
    "{cls} has firing conditions ({conditions}) but does not implement "
    "do(which_callback, *args), which they call: implement do, or override the hooks "
    "themselves and pass no firing keywords"
)


def check_extension(extension: Extension) -> None:
    """Raise, saying what to do, for a mistake in an extension that would otherwise pass silently.

    A subclass whose ``__init__`` did not call ``super().__init__()``; a public
    method named almost like a hook (``after_epochs``) or named as a hook of
    Keras, Lightning, Ignite or Blocks (``on_epoch_end``: :data:`FOREIGN_HOOKS`),
    which the loop would never call; an overridden hook that cannot take the
    hook's arguments; firing conditions without :meth:`~Extension.do`.

    Raises
    ------
    TypeError
        For each of them, naming the class and the method.
    """
    cls = type(extension).__name__
    if "conditions" not in vars(extension):
        raise TypeError(NO_SUPER_INIT.format(cls=cls))
    own = {
        name
        for klass in type(extension).__mro__
        if klass not in (Extension, object)
        for name, value in vars(klass).items()
        if callable(value) and not name.startswith("_")
    }
    for method in sorted(own - set(HOOKS) - set(dir(Extension))):
        if method in FOREIGN_HOOKS:
            hook, library = FOREIGN_HOOKS[method]
            note = _AFTER_EVALUATE if method.startswith(("on_test", "on_validation")) else ""
            raise TypeError(
                ANOTHER_LIBRARYS_HOOK.format(
                    cls=cls, method=method, library=library, hook=hook, note=note, hooks=list(HOOKS)
                )
            )
        close = difflib.get_close_matches(method, HOOKS, n=1, cutoff=0.8)
        if close:
            raise TypeError(
                LOOKS_LIKE_A_HOOK.format(cls=cls, method=method, hook=close[0], hooks=list(HOOKS))
            )
    for hook in HOOKS:
        if extension.overrides(hook):
            _check_signature(extension, hook)
    if extension.conditions and type(extension).do is Extension.do:
        raise TypeError(NO_DO.format(cls=cls, conditions=", ".join(sorted(extension.conditions))))


def _check_signature(extension: Extension, hook: str) -> None:
    arguments = HOOK_ARGUMENTS.get(hook, ())
    try:
        signature = inspect.signature(getattr(extension, hook))
    except (TypeError, ValueError):  # a builtin or a callable object: nothing to tell
        return
    try:
        signature.bind(*arguments)
    except TypeError:
        raise TypeError(
            WRONG_SIGNATURE.format(
                cls=type(extension).__name__,
                hook=hook,
                signature=signature,
                arguments=", ".join(arguments),
                parameters="".join(f", {a}" for a in arguments),
            )
        ) from None


def check_record_names(
    extensions: Sequence[Extension], reserved: Optional[Mapping[str, Sequence[str]]] = None
) -> None:
    """Raise ``ValueError`` where two extensions of a loop would write the same record.

    One would replace the other's values in the rows both write, and the log
    would hold values of two meanings under one name. Each extension declares
    its records in :attr:`~Extension.record_names` (once attached);
    ``reserved`` maps another writer (the loop) to records no extension may write.
    """
    writers: Dict[str, Tuple[str, Optional[Extension]]] = {
        record: (owner, None) for owner, records in (reserved or {}).items() for record in records
    }
    for extension in extensions:
        clashes: Dict[str, List[str]] = {}
        for record in dict.fromkeys(extension.record_names):
            owner, writer = writers.setdefault(record, (extension.name, extension))
            if writer is not extension:
                clashes.setdefault(owner, []).append(record)
        for owner, records in clashes.items():
            raise ValueError(
                f"{owner} and {extension.name} would both write the records "
                f"{sorted(records)}: one would overwrite the other's values in the log. "
                "Give each record one writer: rename the records of your own extension, or "
                "give a built-in another name for them: TrainingMonitoring(..., "
                "prefix='train_window'), Evaluate({'valid_full': iterator}, ...)"
            )


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

    def print_profile(self) -> None:
        """Print :meth:`profile` as a table."""
        print(f"{'extension':<24}{'hook':<18}{'calls':>10}{'seconds':>12}{'us/call':>10}")
        for name, hook, calls, seconds in self.profile():
            per_call = 1e6 * seconds / calls if calls else 0.0
            print(f"{name:<24}{hook:<18}{calls:>10}{seconds:>12.4f}{per_call:>10.1f}")

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
