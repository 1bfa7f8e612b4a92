"""What a loop answers about the network it trains: parameters, predictions, scores, costs.

:class:`LoopQueries` is a part of :class:`~mxoid.MainLoop` (its base class), kept apart
so that the loop's own module holds how it is built and how it trains.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import mxnet as mx
import numpy as np

from .accumulation import pending_gradients
from .ranks import gather_rank_states

if TYPE_CHECKING:  # pragma: no cover
    from ..executor_manager import DataParallelExecutorManager

__all__ = ["LoopQueries"]


class LoopQueries:
    """The network's parameters, predictions and scores, and the hooks' costs, as of now."""

    manager: DataParallelExecutorManager

    # ------------------------------------------------------------ the network
    def synchronize(self) -> None:
        """Wait for the training step in flight: before reading, saving or evaluating the network.

        The per-batch path never waits; an extension that reads
        ``manager.param_arrays``, ``aux_arrays`` or ``outputs`` calls this
        first (why: :meth:`DataParallelExecutorManager.synchronize`).
        """
        self.manager.synchronize()

    def get_params(self) -> Tuple[Dict[str, mx.nd.NDArray], Dict[str, mx.nd.NDArray]]:
        """Return ``(arg_params, aux_params)``, the model being trained, as host copies.

        Waits for the step in flight; BatchNorm statistics are first averaged
        over the devices and written back (the Notes of :class:`MainLoop`).
        """
        self.manager.reconcile_aux_states()
        return self.manager.get_params()

    # ------------------------------------------------------------- inference
    def predict(
        self, iterator: mx.io.DataIter, outputs: Optional[Union[str, Sequence[str]]] = None
    ) -> Dict[str, np.ndarray]:
        """Return output name -> NumPy array over the iterator's real samples, as of now.

        As ``Module.predict(merge_batches=True)``: the padding of a last batch
        is dropped; ``outputs`` picks some (``'softmax'``); the iterator needs
        no labels and is reset before and after. See :func:`mxoid.inference.predict_on`.
        """
        from ..inference import predict_on

        return predict_on(
            self.manager, self.symbol, iterator, outputs, self.max_batches_ahead, self.buckets
        )

    def score(
        self, iterator: mx.io.DataIter, metrics: Any, name: str = "valid"
    ) -> Dict[str, float]:
        """Return the records :class:`~mxoid.extensions.Evaluate` computes on ``iterator`` now.

        ``metrics`` as Evaluate takes them; records ``<name>_<metric>``; nothing
        is logged. In distributed training every worker calls it.
        """
        from ..inference import score_on

        return score_on(self, iterator, metrics, name)

    def pending_gradients(self) -> Optional[Dict[str, mx.nd.NDArray]]:
        """Return the gradients of an unfinished accumulation group (see :mod:`.accumulation`)."""
        return pending_gradients(self.status, self.manager, self.accumulate_batches)

    def checkpoint_files(
        self, arg_params: Dict[str, mx.nd.NDArray], aux_params: Dict[str, mx.nd.NDArray]
    ) -> Dict[str, Callable[[str], Any]]:
        """Return the files a checkpoint holds beside MXNet's, by name.

        A Gluon block's (:meth:`mxoid.gluon.GluonNetwork.checkpoint_files`); none for a symbol.
        """
        gluon = getattr(self, "gluon", None)
        return {} if gluon is None else gluon.checkpoint_files(arg_params, aux_params)

    def gather_rank_states(self, mxnet_seed: int) -> Optional[List[Dict[str, Any]]]:
        """Return every worker's random states and iterator position, in rank order.

        A collective call in distributed training, which every worker makes at
        the same batch (:func:`mxoid.main_loop.ranks.gather_rank_states`); None
        on one worker. ``mxnet_seed``: the seed this worker gives MXNet there.
        """
        return gather_rank_states(self, mxnet_seed)  # type: ignore[arg-type]

    def optimizer_states(self) -> Optional[bytes]:
        """Return the optimizer and its states as MXNet dumps them (None: on the servers)."""
        return self.update.states()

    # -------------------------------------------------------------- profile
    def profile(self) -> List[tuple]:
        """Return ``(extension, hook, calls, seconds)`` per dispatched hook, slowest first."""
        return self.dispatcher.profile()

    def print_profile(self) -> None:
        """Print the time each extension spent in each hook."""
        self.dispatcher.print_profile()
