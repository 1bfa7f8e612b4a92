"""Inference without going back to Module: outputs over the real samples of an iterator.

:meth:`mxoid.MainLoop.predict` runs the loop's network, on its devices and
with its current parameters; :class:`Predictor` runs a saved model (an mxoid
checkpoint or a Module checkpoint prefix). Both return, for each output, one
NumPy array over the iterator's real samples (the padding of a last batch
dropped), as ``Module.predict`` concatenates them.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import mxnet as mx
import numpy as np

from .checkpoint.loading import load_model
from .data.evaluation import evaluation_iterator, random_states_kept, warn_left_out
from .executor_manager import DataParallelExecutorManager, ExecutorSet, output_short_name
from .executor_manager.devices import check_contexts
from .executor_manager.pacing import DEFAULT_MAX_BATCHES_AHEAD, Pacer, check_max_batches_ahead
from .network import as_network
from .precision import check_mixed_precision

__all__ = [
    "Predictor",
    "input_descs",
    "label_descs_for",
    "predict_on",
    "predict_outputs",
    "score_on",
]

Descs = List[mx.io.DataDesc]


def _is_label(name: str) -> bool:
    return name.endswith("_label") or name == "label"


def input_descs(
    symbol: mx.sym.Symbol,
    data: Sequence[Tuple[str, Sequence[np.ndarray]]],
    label_names: Sequence[str],
) -> Tuple[Descs, Descs]:
    """Return the data and label descriptions for a forward pass on these data arrays.

    ``data`` pairs each data name with its array (for its shape and type); the
    labels ``label_names`` get the shapes the symbol infers from the data
    (their values are not read by a forward pass with ``is_train=False``).
    """
    data_descs = [mx.io.DataDesc(name, array.shape, array.dtype) for name, array in data]
    return data_descs, label_descs_for(symbol, data_descs, label_names)


def label_descs_for(symbol: mx.sym.Symbol, data_descs: Descs, label_names: Sequence[str]) -> Descs:
    """Return the descriptions of ``label_names``, as the symbol infers them from the data."""
    if not label_names:
        return []
    shapes, _, _ = symbol.infer_shape_partial(**{d.name: d.shape for d in data_descs})
    by_name = dict(zip(symbol.list_arguments(), shapes))
    label_descs = []
    for name in label_names:
        shape = tuple(by_name.get(name) or ())
        if not shape or 0 in shape:
            raise ValueError(
                f"the network takes {name!r}, whose shape cannot be inferred from the data "
                f"{[(d.name, d.shape) for d in data_descs]}; give an iterator that provides it"
            )
        label_descs.append(mx.io.DataDesc(name, shape))
    return label_descs


def predict_outputs(
    manager_for: Callable[[mx.io.DataBatch], Union[DataParallelExecutorManager, ExecutorSet]],
    iterator: mx.io.DataIter,
    outputs: Optional[Union[str, Sequence[str]]],
    output_names: Sequence[str],
    max_batches_ahead: Union[int, str, None] = DEFAULT_MAX_BATCHES_AHEAD,
) -> Dict[str, np.ndarray]:
    """Run ``iterator`` forward through the managers ``manager_for(batch)`` gives.

    Returns output name -> one array over the real samples. The iterator is
    read as :func:`mxoid.data.evaluation.evaluation_iterator` chooses (an
    ``mx.rnn.BucketSentenceIter``: every sentence once, bucket by bucket, in
    the order of :class:`~mxoid.data.sentences.SentencesInOrder`), reset
    before and after, what it draws from the global generators given back.
    Copies to the host are queued per batch and read once at the end; the
    host waits for the devices only when it is
    ``max_batches_ahead`` batches of a manager ahead of them (see
    :mod:`mxoid.pacing`; ``'auto'``: 64 MiB, each batch counted twice its inputs; None:
    never).
    """
    names = _output_names(outputs, output_names)
    parts: Dict[str, List[mx.nd.NDArray]] = {name: [] for name in names}
    given, iterator = iterator, evaluation_iterator(iterator)
    with random_states_kept():
        seen = _predict_batches(manager_for, iterator, names, parts, max_batches_ahead)
    if not any(parts.values()):
        raise ValueError("the iterator yielded no samples; is it empty?")
    warn_left_out("predict", given, seen)
    return {name: np.concatenate([p.asnumpy() for p in arrays]) for name, arrays in parts.items()}


def _predict_batches(
    manager_for: Callable[[mx.io.DataBatch], Any],
    iterator: mx.io.DataIter,
    names: Sequence[str],
    parts: Dict[str, List[mx.nd.NDArray]],
    max_batches_ahead: Union[int, str, None],
) -> int:
    """Queue each batch's outputs' copies into ``parts``; return the real rows seen."""
    cpu = mx.cpu()
    pacers: Dict[int, Optional[Pacer]] = {}
    seen = 0
    iterator.reset()
    try:
        for batch in iterator:
            manager = manager_for(batch)
            manager.load_data_batch(batch, labels=False)
            manager.forward(is_train=False)
            if id(manager) not in pacers:
                pacers[id(manager)] = Pacer.of(manager, max_batches_ahead)
            pacer = pacers[id(manager)]
            if pacer is not None:
                pacer.queued()
            for name in names:
                for array, rows, slc in zip(
                    manager.outputs[name], manager.valid_rows, manager.slices
                ):
                    if rows == slc.stop - slc.start:
                        parts[name].append(array.copyto(cpu))
                    elif rows > 0:  # per sample, one row of output or several (tokens)
                        per_sample = array.shape[0] // (slc.stop - slc.start)
                        parts[name].append(array[: rows * per_sample].copyto(cpu))
            seen += sum(manager.valid_rows)
    finally:
        iterator.reset()
    return seen


def predict_on(
    manager: DataParallelExecutorManager,
    network: Any,
    iterator: mx.io.DataIter,
    outputs: Optional[Union[str, Sequence[str]]],
    max_batches_ahead: Union[int, str, None] = DEFAULT_MAX_BATCHES_AHEAD,
) -> Dict[str, np.ndarray]:
    """Run ``iterator`` forward through a training manager's network, as it stands now.

    What :meth:`mxoid.MainLoop.predict` does: the devices' BatchNorm statistics
    averaged first, the engine idle before and after, and each shape of batch
    on an executor set of its own, which the network chooses
    (:meth:`mxoid.network.Network.forward_set`: a bucket's batch on its
    bucket's graph, a Gluon block's traced in predict mode). ``network``: the
    loop's :class:`~mxoid.network.Network` (mxoid 0.4's ``buckets`` argument
    is one), or a symbol, as mxoid 0.4 took it.
    """
    network = as_network(network, None)

    def executors_for(batch: mx.io.DataBatch) -> ExecutorSet:
        data = list(zip(manager.data_names, batch.data))
        key = network.key_of(batch)
        if key is None:
            descs = input_descs(network.symbol, data, manager.label_names)
        else:  # a graph's batch says its labels' shapes (the graph may not tell them)
            descs = [mx.io.DataDesc(n, a.shape, a.dtype) for n, a in data], batch.provide_label
        return network.forward_set(manager, *descs, key=key)

    manager.reconcile_aux_states()
    manager.synchronize()
    try:
        return predict_outputs(
            executors_for, iterator, outputs, manager.output_names, max_batches_ahead
        )
    finally:
        manager.synchronize()


def score_on(
    loop: Any, iterator: mx.io.DataIter, metrics: Any, name: str, parameters: Any = None
) -> Dict[str, float]:
    """Return the records an :class:`~mxoid.extensions.Evaluate` of ``loop`` computes now.

    What :meth:`mxoid.MainLoop.score` does; nothing is written into the log.
    """
    from .extensions.evaluation import Evaluate

    evaluation = Evaluate({name: iterator}, metrics, name=f"score_{name}", parameters=parameters)
    evaluation.attach(loop)
    return evaluation.evaluate()


def _output_names(outputs: Optional[Union[str, Sequence[str]]], known: Sequence[str]) -> List[str]:
    if outputs is None:
        return list(known)
    names = [outputs] if isinstance(outputs, str) else list(outputs)
    for name in names:
        short = name[: -len("_output")] if name.endswith("_output") else name
        if short not in known:
            raise ValueError(f"the network has no output {name!r}; its outputs are {list(known)}")
    return names


def _data_of(batch: mx.io.DataBatch, iterator: Any) -> List[Tuple[str, mx.nd.NDArray]]:
    provided = getattr(batch, "provide_data", None) or iterator.provide_data
    names = [d[0] if isinstance(d, tuple) else d.name for d in provided]
    if len(names) != len(batch.data):
        raise ValueError(f"the batch has {len(batch.data)} data arrays for the names {names}")
    return list(zip(names, batch.data))


def batch_key(data: Sequence[Tuple[str, mx.nd.NDArray]]) -> tuple:
    """Return what a batch's executors are bound for: its data names, shapes and types."""
    return tuple((name, tuple(array.shape), np.dtype(array.dtype).str) for name, array in data)


class Predictor:
    """A saved network on some devices, for predictions.

    Parameters
    ----------
    source : str or path-like
        An mxoid checkpoint folder, a checkpoint directory (its newest whole
        checkpoint, or the one of ``epoch``), or a Module checkpoint prefix
        (``prefix-symbol.json`` and ``prefix-NNNN.params``; the highest
        epoch, or ``epoch``). See :mod:`mxoid.checkpoint.loading`.
    contexts : Context or list of Context, optional
        Devices; ``[mx.cpu()]`` by default. Each batch is split over them.
    epoch : int, optional
    max_batches_ahead : int, 'auto' or None, default 'auto'
        How many batches the host may queue ahead of the devices, as
        :class:`~mxoid.MainLoop`'s (None: no bound).
    mixed_precision : {None, 'bfloat16', 'float16'}, default None
        Compute in this type, as :class:`~mxoid.MainLoop`'s: the saved float32
        model converted by MXNet's AMP (:mod:`mxoid.precision`), its parameters
        kept float32 and its outputs float32.

    Attributes
    ----------
    symbol : mx.sym.Symbol
        The graph the executors run (converted under mixed precision).
    arg_params, aux_params : dict of str to NDArray

    Examples
    --------
    .. code-block:: python

        predictor = mxoid.Predictor("checkpoints")      # the newest checkpoint
        probabilities = predictor.predict(test_iter)["softmax"]

    Executors are bound for the shapes of the first batch and, sharing its
    parameters, once for each other shape met (a smaller last batch), then
    reused. A batch of fewer rows than devices runs on the first devices, one
    row each.
    """

    def __init__(
        self,
        source: os.PathLike[str] | str,
        contexts: Union[None, mx.Context, Sequence[mx.Context]] = None,
        *,
        epoch: Optional[int] = None,
        max_batches_ahead: Union[int, str, None] = DEFAULT_MAX_BATCHES_AHEAD,
        mixed_precision: Optional[str] = None,
    ) -> None:
        self.max_batches_ahead = check_max_batches_ahead(max_batches_ahead)
        self.contexts = check_contexts(contexts)
        precision = check_mixed_precision(mixed_precision, self.contexts)
        symbol, self.arg_params, self.aux_params = load_model(source, epoch)
        if precision is not None:
            known = set(self.arg_params) | set(self.aux_params)
            symbol = precision.convert(symbol, [n for n in symbol.list_inputs() if n not in known])
        self.symbol = symbol
        self.output_names = [output_short_name(n) for n in symbol.list_outputs()]
        self._base: Optional[DataParallelExecutorManager] = None
        self._managers: Dict[tuple, DataParallelExecutorManager] = {}

    def predict(
        self, iterator: mx.io.DataIter, outputs: Optional[Union[str, Sequence[str]]] = None
    ) -> Dict[str, np.ndarray]:
        """Return output name -> NumPy array over the iterator's real samples.

        ``outputs`` picks some outputs (``'softmax'`` or ``'softmax_output'``);
        all by default.
        """
        return predict_outputs(
            lambda batch: self._manager(_data_of(batch, iterator)),
            iterator,
            outputs,
            self.output_names,
            self.max_batches_ahead,
        )

    def _manager(self, data: List[Tuple[str, mx.nd.NDArray]]) -> DataParallelExecutorManager:
        key = batch_key(data)
        manager = self._managers.get(key)
        if manager is not None:
            return manager
        names = {name for name, _ in data}
        inputs = [n for n in self.symbol.list_arguments() if n not in self.arg_params]
        missing = [n for n in inputs if n not in names and not _is_label(n)]
        if missing:
            raise ValueError(
                f"the saved model has no values for {missing} and the iterator does not "
                f"provide them (it provides {sorted(names)})"
            )
        labels = [n for n in inputs if n not in names]
        data_descs, label_descs = input_descs(self.symbol, data, labels)
        if self._base is None:
            # Bound for a batch of at least one row per device, so that a first
            # batch of fewer rows (which runs on the first devices) leaves the
            # later, larger ones all the devices.
            rows = max(int(data_descs[0].shape[0]), len(self.contexts))
            base_data = [
                mx.io.DataDesc(d.name, (rows,) + tuple(d.shape[1:]), d.dtype) for d in data_descs
            ]
            manager = DataParallelExecutorManager(
                self.symbol,
                self.contexts,
                base_data,
                label_descs_for(self.symbol, base_data, labels),
                for_training=False,
            )
            lacking = [n for n in manager.aux_names if n not in self.aux_params]
            if lacking:
                raise ValueError(
                    f"the saved model has no values for the auxiliary states {lacking}"
                )
            params = set(manager.param_names)
            manager.set_params(
                {n: v for n, v in self.arg_params.items() if n in params},
                {n: v for n, v in self.aux_params.items() if n in manager.aux_names},
            )
            self._base = manager
        manager = self._base.evaluation_manager(data_descs, label_descs)  # itself for its shapes
        self._managers[key] = manager
        return manager
