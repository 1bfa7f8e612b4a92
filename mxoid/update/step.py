"""The per-batch optimizer step of a loop, as :func:`prepare_update` sets it up."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Dict, Optional, Sequence, Union

import mxnet as mx

from ..distributed.servers import is_asynchronous, is_distributed, set_server_optimizer
from .functions import local_update_parts, prepared_update_on_kvstore
from .fused_updater import create_updater
from .kvstore import initialize_kvstore, kvstore_keys
from .loss_scaler import exact_rescale
from .optimizer import create_optimizer, optimizer_settings

if TYPE_CHECKING:  # pragma: no cover
    from ..executor_manager import DataParallelExecutorManager

__all__ = ["Update", "prepare_update"]


class Update:
    """The optimizer step of a loop, as :func:`prepare_update` sets it up.

    Attributes
    ----------
    kvstore : KVStore or None
    update_on_kvstore : bool
        Whether the kvstore (its updater, or the servers) runs the optimizer.
    optimizer : mx.optimizer.Optimizer
        The optimizer that updates the parameters (replaced by
        :meth:`load_states`: the checkpoint's).
    updater : mx.optimizer.Updater or None
        The local updater, when the kvstore does not update.
    settings : dict
        :func:`optimizer_settings` of the optimizer as the loop was given it.
    step : callable
        Called with no argument after a backward pass (the last of a group, with
        gradient accumulation): sums the gradients and updates the parameters on
        every device. It is ``reduce`` then ``apply``.
    reduce : callable or None
        The first half: sums each gradient over the devices (and workers) in
        place, so every device holds the sum. None when there is nothing to sum
        there: one device and no kvstore, or the kvstore updates (it sums).
    apply : callable
        The second half: the optimizer's update.
    rows : int
        Rows of a batch whose step the optimizer's ``rescale_grad`` averages
        (the training set's batch size; :meth:`average_over` changes it).
    server_gradients : list of NDArray
        With a distributed kvstore that updates (the servers run the optimizer,
        with the ``rescale_grad`` they were given): every gradient array, which
        the step scales before the push for a batch of other rows
        (:meth:`average_over`). Empty otherwise.
    loss_scaler : mxoid.update.LossScaler or None
        With loss scaling (``MainLoop(loss_scale=...)``): the scale, which the
        step divides out of ``rescale_grad`` (:meth:`set_loss_scale`), and the
        check that skips a step whose gradients overflowed. Set by the loop.
    divide_gradients : bool
        Whether the loss scaler divides the gradients by the scale before the
        update, where ``rescale_grad`` cannot (:meth:`set_loss_scale`).
    """

    def __init__(
        self,
        kvstore: Optional[mx.kvstore.KVStore],
        update_on_kvstore: bool,
        optimizer: mx.optimizer.Optimizer,
        updater: Optional[mx.optimizer.Updater],
        reduce: Optional[Callable[[], None]],
        apply: Callable[[], None],
        server_gradients: Sequence[mx.nd.NDArray] = (),
    ) -> None:
        self.kvstore = kvstore
        self.update_on_kvstore = update_on_kvstore
        self.optimizer = optimizer
        self.updater = updater
        self.settings = optimizer_settings(optimizer)
        self.server_gradients = list(server_gradients)
        self._gradient_scale = 1.0  # of server_gradients before the push (average_over)
        if self.server_gradients:
            push = apply

            def apply() -> None:
                if self._gradient_scale != 1.0:
                    self._scale_gradients()
                push()

        self.reduce, self.apply = reduce, apply
        self.rows = self._batch_rows = 0  # set by prepare_update
        self._accumulate, self._workers, self._default_rescale = 1, 1, None
        self._loss_scale, self._unscaled = 1.0, optimizer.rescale_grad
        self.loss_scaler: Any = None
        self.divide_gradients = False
        if reduce is None:
            self.step = apply
        else:

            def step() -> None:
                reduce()
                apply()

            self.step = step

    def settle_buffers(self, synchronize: Callable[[], None]) -> None:
        """Let the kvstore's updater reuse its prepared calls (see ``FusedUpdater``).

        When it has buffers to settle, wait for the engine (``synchronize``)
        and note them: once at the end of the first epoch, and again after
        new plans (new optimizer states from a checkpoint).
        """
        updater = self._states_updater() if self.update_on_kvstore else None
        if getattr(updater, "buffers_to_settle", False):
            synchronize()
            updater.settle_buffers()

    def average_over(self, rows: Optional[int] = None) -> None:
        """Make the next steps average the gradient over batches of ``rows`` rows (None: all).

        A short last batch trained at its real size (a Gluon ``DataLoader``'s
        ``last_batch='keep'``) takes the step ``trainer.step(real_rows)`` takes:
        ``rescale_grad`` becomes ``1 / real_rows`` (for the default rescaling;
        a ``rescale_grad`` of one's own is scaled by ``batch_size / rows``).
        With ``accumulate_batches=k`` the group is counted as ``k - 1`` whole
        batches and this one. None gives back the batch size's rescaling.

        Where the servers of a distributed kvstore run the optimizer, its
        ``rescale_grad`` is theirs, fixed when the loop started: the gradients
        are scaled on the workers before the push instead (by
        ``new rescale_grad / rescale_grad``, :attr:`server_gradients`), so that
        the servers' step is the same.
        """
        rows = self._batch_rows if rows is None else rows
        if rows == self.rows:
            return
        base = self._batch_rows
        if rows == base:
            rescale = self._rescale
        elif self._rescale == self._default_rescale:
            rescale = 1.0 / (((self._accumulate - 1) * base + rows) * self._workers)
        else:
            whole = self._accumulate * base
            rescale = self._rescale * whole / (whole - base + rows)
        if self.server_gradients:
            self._gradient_scale = rescale / self._rescale
        else:
            self._unscaled = rescale
            self._rescale_for_scale()
        self.rows = rows

    def set_loss_scale(self, scale: float) -> None:
        """Make the step divide the gradients by the loss scale ``scale`` (1: none).

        Through the optimizer's ``rescale_grad`` where that is exact: the
        rescaling of the batch (:meth:`average_over`) divided by ``scale``,
        as MXNet's kernels will read it (:func:`~mxoid.update.loss_scaler.exact_rescale`).
        Where MXNet cannot read that value, or the servers of a distributed
        kvstore run the optimizer with their own ``rescale_grad``, it stays the
        batch's and :attr:`divide_gradients` asks the loss scaler to multiply
        the gradients by ``1 / scale`` before the update (the push) instead.
        """
        self._loss_scale = float(scale)
        self._rescale_for_scale()

    def _rescale_for_scale(self) -> None:
        if self.server_gradients:  # the servers' rescale_grad is theirs: the workers divide
            self.divide_gradients = self._loss_scale != 1.0
            return
        exact = None
        if self._loss_scale != 1.0:
            exact = exact_rescale(self._unscaled, self._loss_scale)
        self.divide_gradients = self._loss_scale != 1.0 and exact is None
        self.optimizer.rescale_grad = self._unscaled if exact is None else exact

    def _scale_gradients(self) -> None:
        """Multiply every gradient by the step's scale, in place (queued on the engine)."""
        scale = self._gradient_scale
        for gradient in self.server_gradients:
            gradient *= scale

    def _states_updater(self) -> Optional[mx.optimizer.Updater]:
        """Return the updater holding the optimizer states here; None when the servers hold them."""
        if self.update_on_kvstore:
            return getattr(self.kvstore, "_updater", None)
        return self.updater

    def states(self) -> Optional[bytes]:
        """Return the optimizer and its states as MXNet dumps them.

        None with a distributed kvstore that updates (the states live on the servers).
        """
        updater = self._states_updater()
        return None if updater is None else updater.get_states(dump_optimizer=True)

    def load_states(self, states: bytes) -> mx.optimizer.Optimizer:
        """Give the updater holding the optimizer states those of a checkpoint.

        ``states`` are MXNet's dump of an updater with its optimizer
        (``get_states(dump_optimizer=True)``). Returns the optimizer they hold,
        which the updater now uses, with its states (momentum, update counts,
        schedule); :meth:`use_optimizer` makes it this step's.
        """
        updater = self._states_updater()
        updater.set_states(states)
        return updater.optimizer

    def use_optimizer(self, optimizer: mx.optimizer.Optimizer) -> None:
        """Make ``optimizer`` (the one :meth:`load_states` returned) the one that updates.

        It keeps this step's index-to-name map (the indices its update functions
        use); the fused updater prepares its calls anew.
        """
        optimizer.idx2name = self.optimizer.idx2name.copy()
        self.optimizer = optimizer
        if self.loss_scaler is not None:  # saved for the scale of then: this loop's
            self._rescale_for_scale()
        updater = self._states_updater()
        if hasattr(updater, "_plans"):
            updater._plans.clear()


def prepare_update(
    manager: DataParallelExecutorManager,
    symbol: mx.sym.Symbol,
    kvstore: Optional[mx.kvstore.KVStore],
    update_on_kvstore: bool,
    optimizer: Union[str, mx.optimizer.Optimizer],
    optimizer_params: Optional[Dict[str, object]],
    arg_params: Dict[str, mx.nd.NDArray],
    accumulate_batches: int = 1,
) -> Update:
    """Set up the optimizer step: the optimizer, the kvstore's contents, the updater.

    Call it once the devices hold the initial parameters (``arg_params``, host
    copies: they go on the kvstore). With a distributed kvstore the servers
    get their :class:`~mxoid.distributed.ServerOptimizer` (a collective
    call). On one machine an updating kvstore gets mxoid's faster updater.
    """
    optimizer = create_optimizer(
        optimizer,
        optimizer_params,
        symbol=symbol,
        param_names=manager.param_names,
        num_devices=len(manager.contexts),
        batch_size=manager.batch_size,
        kvstore=kvstore,
        update_on_kvstore=update_on_kvstore,
        accumulate_batches=accumulate_batches,
    )
    keys = kvstore_keys(kvstore, manager.param_names)
    updater = None if update_on_kvstore else create_updater(optimizer)
    if kvstore is not None:
        initialize_kvstore(
            kvstore, manager.param_arrays, arg_params, manager.param_names, update_on_kvstore, keys
        )
        if is_distributed(kvstore):
            set_server_optimizer(
                kvstore, optimizer if update_on_kvstore else None, len(manager.param_names)
            )
        elif update_on_kvstore:
            # What kvstore.set_optimizer does on one machine, with the faster updater.
            kvstore._set_updater(create_updater(optimizer, kvstore_buffers=True))
    if update_on_kvstore:
        reduce = None
        apply = prepared_update_on_kvstore(manager.param_arrays, manager.grad_arrays, kvstore, keys)
    else:
        reduce, apply = local_update_parts(
            manager.param_arrays, manager.grad_arrays, updater, len(manager.contexts), kvstore, keys
        )
    on_servers = update_on_kvstore and is_distributed(kvstore)
    gradients = [g for grads in manager.grad_arrays for g in grads if g is not None]
    update = Update(
        kvstore,
        update_on_kvstore,
        optimizer,
        updater,
        reduce,
        apply,
        server_gradients=gradients if on_servers else (),
    )
    update.rows = update._batch_rows = manager.batch_size
    update._rescale, update._accumulate = optimizer.rescale_grad, accumulate_batches
    update._unscaled = optimizer.rescale_grad
    update._default_rescale = 1.0 / (accumulate_batches * manager.batch_size)
    if is_distributed(kvstore) and not is_asynchronous(kvstore):
        update._workers = kvstore.num_workers
        update._default_rescale /= kvstore.num_workers
    return update
