"""The Extension base class and its firing conditions (the predicates: :mod:`.predicates`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Union

from . import predicates
from .predicates import Count, OnLogRecord, Predicate, always

if TYPE_CHECKING:  # pragma: no cover
    from ..main_loop import MainLoop

__all__ = ["FIRING_KEYWORDS", "HOOKS", "Extension", "HeadRequest", "OnLogRecord", "Predicate"]

HOOKS = (
    "before_training",
    "on_resumption",
    "before_epoch",
    "before_batch",
    "after_backward",
    "before_update",
    "after_update",
    "after_batch",
    "after_epoch",
    "after_training",
    "on_interrupt",
    "on_error",
)
"""Every hook the loop dispatches, in the order they first fire."""

FIRING_KEYWORDS = ("every_n_batches", "every_n_epochs", "after_n_batches", "after_n_epochs") + HOOKS
"""The keywords of :class:`Extension` that add a firing condition: a count, or a hook name."""

HOOK_ARGUMENTS = {
    "before_batch": ("batch",),
    "after_backward": ("batch",),
    "after_batch": ("batch",),
    "on_error": ("exception",),
}
"""The arguments each hook is called with (the others take none)."""

COUNTED_IN: Dict[str, Callable[[int], Count]] = {
    **dict.fromkeys(
        ("before_batch", "after_backward", "before_update", "after_update", "after_batch"),
        predicates.every_n_batches,
    ),
    "before_epoch": predicates.every_n_epochs,
    "after_epoch": predicates.every_n_epochs,
}
"""The hooks a keyword may give a count (``after_backward=4``), and what the count counts."""


def _positive(name: str, value: Optional[int]) -> Optional[int]:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


def _hook_keyword(hook: str, value: Union[bool, int, None]) -> Optional[Predicate]:
    """Return the condition of a hook keyword: True (always), n (every n-th), or none."""
    if value is None or value is False:
        return None
    if value is True:
        return always
    counted = COUNTED_IN.get(hook)
    if counted is None or not isinstance(value, int) or value < 1:
        takes = "True, or a positive int n: every n-th " if counted else "True or False"
        what = ("epoch" if counted is predicates.every_n_epochs else "batch") if counted else ""
        raise ValueError(f"{hook} takes {takes}{what}; got {value!r}")
    return counted(value)


class HeadRequest(NamedTuple):
    """What the loop tells an extension that may want a head (:meth:`Extension.private_head`).

    A private head is a symbol on the network's arrays (behind ``BlockGrad``)
    that the training executors compute after the network's own outputs, in
    the same pass, for the extension alone: the symbol, the manager's
    ``outputs`` and checkpoints are unchanged (see
    :mod:`mxoid.executor_manager.private_heads`).
    """

    symbol: Any
    """The network (``mx.sym.Symbol``)."""
    data_descs: Sequence[Any]
    """The training inputs, as ``train_data.provide_data`` gives them."""
    label_descs: Sequence[Any]
    """The training labels, as ``train_data.provide_label`` gives them."""
    rows_per_device: Sequence[int]
    """How many rows of a training batch each device gets."""
    contexts: Sequence[Any]
    """The devices."""
    running_sums: str
    """The name under which the head may keep running sums of its own (see
    :attr:`mxoid.DataParallelExecutorManager.running_sums`)."""
    key: Any = None
    """The bucket key of these executors (with a ``sym_gen``), or None. Each bucket's
    executors ask again when they are bound, with their own symbol and shapes."""


class Extension:
    """Something that acts on the training loop at its hooks.

    There are two ways to write one; pick whichever reads better.

    1. Override hooks. Each overridden hook runs every time the loop reaches
       it: ``before_training()``, ``on_resumption()``, ``before_epoch()``,
       ``before_batch(batch)``, ``before_update()``, ``after_update()``,
       ``after_batch(batch)``, ``after_epoch()``, ``after_training()``,
       ``on_interrupt()``, ``on_error(exception)``.
       Hooks not overridden cost nothing: the loop never dispatches them.
    2. Implement :meth:`do` and pass firing conditions to the constructor
       (``every_n_epochs=2``, ``after_n_batches=100``, ``after_training=True``,
       ``after_backward=4``...). ``do(which_callback, *args)`` then runs
       whenever one of the conditions holds. Most built-in extensions do what
       they do this way, so that users can change when they fire; a subclass
       sets its defaults with ``kwargs.setdefault('after_epoch', True)`` before
       calling ``super().__init__(**kwargs)``.

    Conditions add up, as in Blocks: at each hook, ``do`` runs once when any
    of that hook's conditions holds, and each keyword adds its own. The count
    keywords belong to one hook each: ``every_n_batches`` and
    ``after_n_batches`` to ``after_batch``, ``every_n_epochs`` and
    ``after_n_epochs`` to ``after_epoch``. So
    ``Extension(after_backward=True, every_n_batches=4)`` runs
    ``do('after_backward', batch)`` at every batch *and*
    ``do('after_batch', batch)`` at every 4th. To run a hook every n batches or
    epochs, give its keyword the count, as Ignite's ``Events.X(every=n)``:
    ``after_backward=4`` (the hooks of a batch count batches, ``before_epoch``
    and ``after_epoch`` count epochs), or add a count of
    :mod:`~mxoid.extensions.predicates` to any hook:
    ``add_condition('after_update', every_n_epochs(2))``. A count is the
    number of the batch or epoch the hook belongs to: every hook of the 4th
    batch sees 4, ``before_batch`` and ``after_backward`` included.

    Both mix: when a class overrides a hook that also has firing conditions,
    the override runs, then ``do`` if a condition holds, unless the override
    called ``super()``'s hook (which fires the conditions at that point). An
    override never disables the conditions.

    The loop is reachable as ``self.main_loop``: its ``manager`` (executors,
    parameters, gradients, ``outputs`` of the last batch), ``optimizer``,
    ``kvstore``, ``status``, ``log`` and ``current_batch``. Records go into
    ``self.main_loop.log.current_row``; declare their names in
    :attr:`record_names`, so that the loop refuses two extensions writing
    the same record. To stop training, call
    ``self.main_loop.request_stop(reason)`` and set the class attribute
    ``stops_training = True``, so the loop knows something can stop it.

    The training pass's outputs, labels and padding (``manager.outputs``,
    ``manager.labels``, ``manager.pad``) are the batch's in ``after_backward``;
    later hooks may run an evaluation on the same executors, which replaces
    them. Read the training pass in ``after_backward``.

    Records written during a batch (from ``after_backward`` to ``after_batch``)
    go into the row of that batch; those of ``before_batch``, into the row
    before it (see :attr:`~mxoid.log.TrainingLog.current_row`).

    The loop checks each extension when it is built: a public method named
    almost like a hook (``after_epochs``) or named as another library's hook
    (``on_epoch_end``), a hook whose signature does not take the hook's
    arguments, a subclass whose ``__init__`` did not call
    ``super().__init__()``, or firing conditions without :meth:`do` are errors
    that say what to do.

    Parameters
    ----------
    name : str, optional
        Shown in error messages and the profile. The class name by default.
    priority : float, default 0
        Extensions run in ascending priority, then in list order. Log writers
        and checkpoints use high priorities so that they see every record of
        the row.
    every_n_batches, every_n_epochs : int, optional
        Fire ``do('after_batch', batch)`` / ``do('after_epoch')`` when the
        count of batches / epochs done is a multiple of n.
    after_n_batches, after_n_epochs : int, optional
        Fire once, when exactly n batches / epochs are done.
    before_training, before_epoch, before_batch, after_backward, before_update,
    after_update, after_batch, after_epoch, after_training, on_resumption,
    on_interrupt, on_error : bool, or int for the hooks of a batch or an epoch
        True: fire ``do`` at every occurrence of that hook. A positive int n
        (hooks of a batch and ``before_epoch`` / ``after_epoch``): at that hook
        of every n-th batch / epoch.
    rank_zero_only : bool, optional
        Override the class default of :attr:`rank_zero_only`.

    Attributes
    ----------
    stops_training : bool
        Class attribute: True when the extension may request a stop.
    rank_zero_only : bool
        In distributed training, run only on the worker of rank 0. A class
        default (True for extensions with side effects: printing, progress
        bars, log files, checkpoints), overridden per instance with the
        ``rank_zero_only=`` keyword.
    main_loop : MainLoop
        Set by :meth:`attach` when a loop is constructed with the extension.

    Examples
    --------
    >>> class GradientNorm(Extension):
    ...     def __init__(self, **kwargs):
    ...         kwargs.setdefault("every_n_batches", 50)
    ...         super().__init__(**kwargs)
    ...     def do(self, which_callback, *args):
    ...         grads = self.main_loop.manager.grad_arrays
    ...         norm = sum(float((g[0] ** 2).sum().asscalar()) for g in grads) ** 0.5
    ...         self.main_loop.log.current_row["grad_norm"] = norm
    """

    stops_training: bool = False
    rank_zero_only: bool = False
    main_loop: Optional[MainLoop] = None
    checkpoint_directory: Optional[str] = None
    """A directory this extension writes checkpoints into, or None. ``resume_from`` may
    name it before it exists (a first run), and an interrupted run's message names it."""

    def __init__(
        self,
        *,
        name: Optional[str] = None,
        priority: float = 0,
        every_n_batches: Optional[int] = None,
        every_n_epochs: Optional[int] = None,
        after_n_batches: Optional[int] = None,
        after_n_epochs: Optional[int] = None,
        before_training: bool = False,
        before_epoch: Union[bool, int] = False,
        before_batch: Union[bool, int] = False,
        after_backward: Union[bool, int] = False,
        before_update: Union[bool, int] = False,
        after_update: Union[bool, int] = False,
        after_batch: Union[bool, int] = False,
        after_epoch: Union[bool, int] = False,
        after_training: bool = False,
        on_resumption: bool = False,
        on_interrupt: bool = False,
        on_error: bool = False,
        rank_zero_only: Optional[bool] = None,
    ) -> None:
        self.name = name or type(self).__name__
        self.priority = priority
        if rank_zero_only is not None:
            self.rank_zero_only = rank_zero_only
        self.conditions: Dict[str, List[Predicate]] = {}
        self._conditions_fired = False
        flags = {
            "before_training": before_training,
            "before_epoch": before_epoch,
            "before_batch": before_batch,
            "after_backward": after_backward,
            "before_update": before_update,
            "after_update": after_update,
            "after_batch": after_batch,
            "after_epoch": after_epoch,
            "after_training": after_training,
            "on_resumption": on_resumption,
            "on_interrupt": on_interrupt,
            "on_error": on_error,
        }
        for hook in HOOKS:
            condition = _hook_keyword(hook, flags[hook])
            if condition is not None:
                self.add_condition(hook, condition)
        if _positive("every_n_batches", every_n_batches):
            self.add_condition("after_batch", predicates.every_n_batches(every_n_batches))
        if _positive("every_n_epochs", every_n_epochs):
            self.add_condition("after_epoch", predicates.every_n_epochs(every_n_epochs))
        if _positive("after_n_batches", after_n_batches):
            self.add_condition("after_batch", predicates.after_n_batches(after_n_batches))
        if _positive("after_n_epochs", after_n_epochs):
            self.add_condition("after_epoch", predicates.after_n_epochs(after_n_epochs))

    def attach(self, loop: MainLoop) -> None:
        """Attach the extension to ``loop``: set ``self.main_loop``.

        The loop that runs the extension calls it once, when the loop is built.
        Extensions that need the loop's executors or services (a distributed
        reduction, for instance) override it, call ``super().attach(loop)``
        first, and ask the loop for them here.
        """
        self.main_loop = loop

    def add_condition(self, hook: str, predicate: Optional[Predicate] = None) -> Extension:
        """Fire :meth:`do` at ``hook`` when ``predicate(log)`` is true (always when None).

        The predicate receives the loop's log (``log.status`` holds the
        counters), e.g. :class:`OnLogRecord`, or is a count of
        :mod:`~mxoid.extensions.predicates` (``every_n_batches(4)``: at
        ``hook`` of every 4th batch, whichever hook). A hook's conditions add
        up: ``do`` runs when any holds. Add conditions before the extension is
        given to a ``MainLoop``. Returns the extension, so calls can be chained.
        """
        if hook not in HOOKS:
            raise ValueError(f"unknown hook {hook!r}; the hooks are {list(HOOKS)}")
        if isinstance(predicate, Count):
            predicate = predicate.at(hook)
        self.conditions.setdefault(hook, []).append(predicate or always)
        return self

    def overrides(self, hook: str) -> bool:
        """Return True when the extension's class overrides the method of ``hook``."""
        return getattr(type(self), hook) is not getattr(Extension, hook)

    def handles(self, hook: str) -> bool:
        """Return True when the loop must dispatch ``hook`` to this extension."""
        return hook in self.conditions or self.overrides(hook)

    def do(self, which_callback: str, *args: Any) -> None:
        """Act; called when a firing condition holds. Subclasses with conditions implement it."""
        raise NotImplementedError(
            f"{type(self).__name__} has firing conditions but does not implement "
            "do(which_callback, *args)"
        )

    def fire_conditions(self, hook: str, *args: Any) -> None:
        """Call :meth:`do` once if one of the conditions of ``hook`` holds.

        The hook methods of this class call it; the loop calls it after an
        overridden hook that did not (an override never disables ``do``).
        """
        self._conditions_fired = True
        log = self.main_loop.log
        for predicate in self.conditions.get(hook, ()):
            if predicate(log):
                self.do(hook, *args)
                return

    _fire = fire_conditions  # the name of mxoid 0.1

    # The hooks. Overriding one makes the loop dispatch it on every occurrence.
    def before_training(self) -> None:
        """Before the first epoch (not again when training resumes)."""
        self.fire_conditions("before_training")

    def on_resumption(self) -> None:
        """When training resumes from a checkpoint, instead of ``before_training``."""
        self.fire_conditions("on_resumption")

    def before_epoch(self) -> None:
        """At the start of each epoch, before its first batch is read."""
        self.fire_conditions("before_epoch")

    def before_batch(self, batch: Any) -> None:
        """Before ``batch`` is loaded into the executors."""
        self.fire_conditions("before_batch", batch)

    def after_backward(self, batch: Any) -> None:
        """After the backward pass of ``batch``, before its update and any evaluation.

        The training pass's outputs, labels and padding are the batch's here
        (``main_loop.manager.outputs``, ``labels``, ``pad``), and so are the
        gradients (with ``accumulate_batches``, added to the group's). Counters
        still count the batches before this one. Nothing waits for the
        devices: what this hook queues on them is computed in order.
        """
        self.fire_conditions("after_backward", batch)

    def before_update(self) -> None:
        """After the backward pass, before the optimizer step.

        The gradients of the batch (with ``accumulate_batches=k``, of the whole
        group of k batches) are in ``main_loop.manager.grad_arrays``; the hook
        may read or change them. With the update on the workers
        (``update_on_kvstore=False``) they are already summed over the devices
        and workers, the same on every device; with the kvstore updating, each
        device holds its own (the kvstore sums them). Counters still count the
        batches before this one.
        """
        self.fire_conditions("before_update")

    def after_update(self) -> None:
        """After the optimizer step; ``status.updates_done`` counts it."""
        self.fire_conditions("after_update")

    def after_batch(self, batch: Any) -> None:
        """After the update of ``batch``; ``status.iterations_done`` counts it."""
        self.fire_conditions("after_batch", batch)

    def after_epoch(self) -> None:
        """After the last batch of an epoch; ``status.epochs_done`` counts it."""
        self.fire_conditions("after_epoch")

    def after_training(self) -> None:
        """When training ends, by a stop request or an interruption."""
        self.fire_conditions("after_training")

    def on_interrupt(self) -> None:
        """When training is interrupted by Ctrl-C or SIGTERM, before ``after_training``."""
        self.fire_conditions("on_interrupt")

    def on_error(self, exception: BaseException) -> None:
        """When training or a hook raised ``exception``, before it propagates."""
        self.fire_conditions("on_error", exception)

    # What the loop asks of every extension when it is built.
    @property
    def record_names(self) -> List[str]:
        """The records this extension writes into the log (known once attached; none here).

        The loop refuses two extensions that declare the same record, and an
        extension that declares a record of the loop's own
        (``training_finish_requested``, ``resumed_from``, ``error``).
        """
        return []

    @property
    def planned_epochs(self) -> Optional[int]:
        """The number of epochs after which this extension stops training, or None (here).

        :class:`~mxoid.extensions.FinishAfter` answers its ``after_n_epochs``;
        :class:`~mxoid.extensions.Printing` shows ``Epoch 3/20`` with the fewest
        that the loop's extensions plan.
        """
        return None

    def private_head(self, request: HeadRequest) -> Any:
        """Return a symbol the training executors compute for this extension, or None.

        Called once, when the loop is built, before :meth:`attach`; the head's
        outputs are then in ``main_loop.private_outputs(self)`` after each
        training forward pass (see :class:`HeadRequest`).
        :class:`~mxoid.extensions.TrainingMonitoring` computes its metrics this
        way. None by default: no head.
        """
        return None

    def checkpoint_files(
        self, arg_params: Dict[str, Any], aux_params: Dict[str, Any]
    ) -> Dict[str, Callable[[str], Any]]:
        """Return file name -> writer(path) of files this extension adds to each checkpoint.

        ``arg_params`` / ``aux_params``: the model saved. None here;
        :class:`~mxoid.ExponentialMovingAverage` writes its averaged model.
        """
        return {}

    # State carried by checkpoints.
    def state_dict(self) -> Dict[str, Any]:
        """Return the extension's own state as plain data; stateless extensions return ``{}``."""
        return {}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Restore the state returned by :meth:`state_dict`."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"
