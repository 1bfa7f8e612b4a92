"""StochasticWeightAveraging: the mean of the parameters at epoch ends, BatchNorm recomputed."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

import mxnet as mx
import numpy as np

from ..data.evaluation import evaluation_iterator, random_states_kept
from ..data.loader import as_data_iter
from .averaging import ParameterAverage

if TYPE_CHECKING:  # pragma: no cover
    from ..main_loop import MainLoop

__all__ = ["StochasticWeightAveraging", "batchnorm_statistics"]

NEEDS_DATA = (
    "{name}: the network has BatchNorm, whose statistics must be recomputed for the "
    "averaged weights by a pass over the training data: pass data=<an iterator over the "
    "training data> (a second one: the loop's own is in use), or data=False to keep the "
    "loop's statistics"
)


class StochasticWeightAveraging(ParameterAverage):
    """The running mean of the parameters after epoch ``start_epoch`` and every n-th after it.

    As ``torch.optim.swa_utils.AveragedModel`` (Izmailov et al., 2018): after
    the ``start_epoch``-th epoch (counting from 1) the average is the
    parameters; after each ``every_n_epochs`` more it becomes the mean of all
    the epochs' parameters taken, updated in place on the devices. Before
    ``start_epoch`` there is no average: :meth:`get_params` and evaluation
    give the loop's parameters.

    BatchNorm's moving statistics of the averaged weights are not the average
    of the statistics: as ``torch.optim.swa_utils.update_bn`` they are
    recomputed, after each new average, by a forward pass in training mode
    over ``data`` with the averaged weights, as the cumulative average over
    its batches of each batch's mean and variance (``momentum=None``; the
    variance as MXNet's BatchNorm computes it, over the batch, not unbiased).
    The loop's own statistics never change. Evaluation, :meth:`get_params`
    and checkpoints (``swa-<epoch>.params``) use the recomputed ones.

    Parameters
    ----------
    start_epoch : int
        The first epoch (from 1) whose parameters are averaged.
    every_n_epochs : int, default 1
    data : mx.io.DataIter or DataLoader, optional
        The training data for BatchNorm's statistics: a second iterator over
        it. Needed when the network has BatchNorm (``False``: keep the loop's
        statistics).
    prefix : str, default 'swa'
        Of its files in checkpoints.
    **kwargs
        Options of :class:`Extension`.

    Examples
    --------
    >>> from mxoid import StochasticWeightAveraging
    >>> swa = StochasticWeightAveraging(start_epoch=8)
    """

    def __init__(
        self,
        start_epoch: int,
        every_n_epochs: int = 1,
        data: Any = None,
        prefix: str = "swa",
        **kwargs: Any,
    ) -> None:
        for name, value in (("start_epoch", start_epoch), ("every_n_epochs", every_n_epochs)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        kwargs.setdefault("after_epoch", True)
        super().__init__(prefix, **kwargs)
        self.start_epoch, self.every_n_epochs, self.data = start_epoch, every_n_epochs, data
        self.count = 0
        self._aux: Optional[Dict[str, mx.nd.NDArray]] = None

    def attach(self, loop: MainLoop) -> None:
        """Find the trained parameters; refuse a BatchNorm network without ``data``."""
        super().attach(loop)
        self._batchnorms = batchnorm_nodes(loop.network.graph())
        if self._batchnorms and self.data is None:
            raise ValueError(NEEDS_DATA.format(name=self.name))
        if self.data is not None and self.data is not False:
            names = (loop.manager.data_names, loop.manager.label_names)
            self.data = as_data_iter(self.data, *names)

    def do(self, which_callback: str, *args: Any) -> None:
        """At the epochs averaged: add the parameters to the mean, recompute BatchNorm's."""
        done = self.main_loop.status.epochs_done
        if done < self.start_epoch or (done - self.start_epoch) % self.every_n_epochs:
            return
        self.count += 1
        if self.count == 1:
            self._start()
        else:
            self._blend(1.0 - 1.0 / self.count)
        if self._batchnorms and self.data is not False:
            self._aux = None
            with self.swapped_in():
                self._aux = batchnorm_statistics(self.main_loop, self.data, self._batchnorms)

    def aux_params(self) -> Optional[Dict[str, mx.nd.NDArray]]:
        """Return the recomputed BatchNorm statistics (None before any: the loop's)."""
        if self._aux is None:
            return None
        manager = self.main_loop.manager
        # The statistics of layers that are not BatchNorm's (none, usually) are the loop's.
        kept = {n: a[0] for n, a in zip(manager.aux_names, manager.aux_arrays)}
        return {**kept, **self._aux}

    def state_dict(self) -> Dict[str, Any]:
        """Return the number of epochs averaged (the values are in the checkpoint's files)."""
        return {**super().state_dict(), "count": self.count, "recomputed": self._aux is not None}

    def _loaded(self, saved: Dict[str, mx.nd.NDArray], state: Dict[str, Any]) -> None:
        self.count = state["count"]
        if state.get("recomputed"):
            self._aux = {n[4:]: v for n, v in saved.items() if n.startswith("aux:")}


def batchnorm_nodes(symbol: mx.sym.Symbol) -> List[Tuple[mx.sym.Symbol, int, str, str]]:
    """Return ``(input, axis, moving_mean name, moving_var name)`` of every BatchNorm in a graph."""
    graph = json.loads(symbol.tojson())
    nodes = graph["nodes"]
    internals = symbol.get_internals()
    outputs = set(internals.list_outputs())
    found = []
    for node in nodes:
        if node["op"] not in ("BatchNorm", "_contrib_SyncBatchNorm"):
            continue
        name = node["name"]
        mean, var = (nodes[node["inputs"][k][0]]["name"] for k in (3, 4))
        head = internals[f"{name}_output"] if f"{name}_output" in outputs else None
        if head is None:
            continue
        axis = int(node.get("attrs", {}).get("axis", 1))
        found.append((head.get_children()[0], axis, mean, var))
    return found


def batchnorm_statistics(
    loop: MainLoop, data: mx.io.DataIter, nodes: List[Tuple[mx.sym.Symbol, int, str, str]]
) -> Dict[str, mx.nd.NDArray]:
    """Return each BatchNorm's cumulative average of batch means and variances over ``data``.

    A forward pass in training mode over every batch (the network's current
    values), each BatchNorm input's per-channel mean and variance computed on
    the devices as one private head, read once per batch. ``nodes``: the
    BatchNorms of the default graph; a batch of another bucket runs on its
    bucket's graph, whose BatchNorms (the same statistics, shared) are found there.
    """
    network = loop.network
    heads: Dict[Any, Tuple[Any, List[Tuple[str, str]], List[int]]] = {}
    total: Dict[str, np.ndarray] = {}
    batches = 0
    read = evaluation_iterator(data)
    with random_states_kept():
        read.reset()
        try:
            for batch in read:
                key = network.key_of(batch)
                if key not in heads:
                    own = batch.provide_data is not None  # a bucket's batch says its shapes
                    descs = (batch.provide_data, batch.provide_label) if own else None
                    descs = descs or (read.provide_data, read.provide_label)
                    default = nodes if key is None else None
                    heads[key] = _statistics_head(loop, descs, key, default)
                executors, names, sizes = heads[key]
                executors.load_data_batch(batch)
                executors.forward(is_train=True)
                rows = np.array([s.stop - s.start for s in executors.slices], dtype=np.float64)
                stats = [out.asnumpy().astype(np.float64) for out in executors.private_outputs[0]]
                combined, offset = _combine(stats, rows, sizes), 0
                for (mean_name, var_name), size in zip(names, sizes):
                    for name in (mean_name, var_name):
                        part = combined[offset : offset + size]
                        total[name] = part if name not in total else total[name] + part
                        offset += size
                batches += 1
        finally:
            read.reset()
    if batches == 0:
        raise ValueError("the data for BatchNorm's statistics yielded no batch")
    return {name: mx.nd.array(value / batches) for name, value in total.items()}


def _statistics_head(
    loop: MainLoop, descs: Tuple[Any, Any], key: Any, nodes: Optional[List[Tuple[Any, ...]]]
) -> Tuple[Any, List[Tuple[str, str]], List[int]]:
    """Return the executor set computing the statistics of a batch's graph, their names, sizes.

    ``descs``: the batch's ``(provide_data, provide_label)``. Bound on first use for its
    bucket (``key``), sharing the training arrays.
    """
    manager, network = loop.manager, loop.network
    if nodes is None:
        nodes = batchnorm_nodes(network.graph(key, *descs))
    parts = []
    for node, axis, _, _ in nodes:
        node = mx.sym.amp_cast(node, dtype="float32")  # bfloat16 under mixed precision
        mean = mx.sym.mean(node, axis=axis, exclude=True, keepdims=True)
        square = mx.sym.square(mx.sym.broadcast_sub(node, mean))
        parts += [mx.sym.flatten(mean).reshape((-1,)), mx.sym.mean(square, axis=axis, exclude=True)]
    head = mx.sym.BlockGrad(mx.sym.concat(*parts, dim=0))
    executors = network.forward_set(manager, descs[0], descs[1], [head], key=key)
    sizes = [manager.aux_arrays[manager.aux_names.index(n[2])][0].shape[0] for n in nodes]
    return executors, [(n[2], n[3]) for n in nodes], sizes


def _combine(stats: List[np.ndarray], rows: np.ndarray, sizes: List[int]) -> np.ndarray:
    """Return the whole batch's per-layer means and variances from each device's slice's."""
    if len(stats) == 1:
        return stats[0]
    weights = rows[: len(stats)] / rows[: len(stats)].sum()
    out = np.empty_like(stats[0])
    offset = 0
    for size in sizes:
        mean, var = slice(offset, offset + size), slice(offset + size, offset + 2 * size)
        out[mean] = sum(w * s[mean] for w, s in zip(weights, stats))
        second = sum(w * (s[var] + s[mean] ** 2) for w, s in zip(weights, stats))
        out[var] = second - out[mean] ** 2
        offset += 2 * size
    return out
