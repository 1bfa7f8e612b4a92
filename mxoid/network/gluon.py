"""A Gluon ``HybridBlock`` and its loss as the graphs a :class:`~mxoid.MainLoop` trains.

A HybridBlock called on ``mx.sym.var`` returns a symbol: the loop binds it, with
the loss as its training objective, to executors like any other, and every
extension applies unchanged. :class:`GluonNetwork` traces the block twice, in
training mode (the graph the loop trains) and in predict mode (the graph it
evaluates and predicts with, where a block branches on ``autograd.is_training()``;
the training graph itself where both are the same graph), takes the block's
parameter values, and gives the trained values back to the block.

The training graph's outputs are the block's outputs, named ``output`` (or
``output0``, ``output1``, ... for several), and the loss, named ``loss``: a
``MakeLoss`` of the loss's value per row, whose gradient is the loss's summed
over the batch; the optimizer's ``rescale_grad`` of ``1 / batch_size`` makes it
``trainer.step(batch_size)``'s. A ``DataLoader``'s short last batch
(``last_batch='keep'``) is trained at its real size, as a Gluon loop trains it
with ``trainer.step(real_rows)``: on executors of that many rows, bound once
and sharing the training set's arrays (as a bucket's are), and a step whose
``rescale_grad`` is ``1 / real_rows`` (where the servers of a distributed
kvstore run the optimizer, the gradients scaled before the push instead:
:meth:`mxoid.update.Update.average_over`); no padding row enters the gradient
or BatchNorm's statistics. A short batch of fewer rows than devices trains on
the devices that get a row, the others' gradients zeroed for that step
(:class:`~mxoid.executor_manager.ExecutorSet`). An ``mx.io.DataIter``'s padded last batch (an
``NDArrayIter``'s) is trained padded, as ``Module.fit`` trains it.

Metrics given without an output name bind to the block's output (a ``MakeLoss``
output is a loss, not a prediction); the loss's mean per batch is the metric
``'loss'`` on the output ``'loss'``. The inputs are named ``data`` (``data0``,
``data1``, ... for a block of several inputs) and the labels ``label``
(``label0``, ...) when the training data is a Gluon ``DataLoader`` (read
through :class:`mxoid.data.DataLoaderIter`); an ``mx.io.DataIter`` names them
itself.
"""

from __future__ import annotations

import inspect
import json
from typing import Any, Dict, List, Optional, Sequence, Tuple

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

from ..data.loader import DataLoaderIter, as_data_iter
from ..executor_manager import DataParallelExecutorManager, ExecutorSet
from .base import AskHeads, Network

__all__ = ["GluonNetwork", "input_names", "is_block", "network_inputs"]

OUTPUT, LOSS = "output", "loss"
STRUCTURE = "gluon_parameters"  # the loop state's record: parameter name by place in the block

NOT_HYBRID = (
    "{what} is a gluon.Block, which mxoid cannot trace to a graph: make it a "
    "gluon.HybridBlock (define hybrid_forward(self, F, x, ...) instead of forward), as "
    "net.hybridize() needs too"
)
NOT_PER_ROW = (
    "the loss returns an array of shape {shape} for a batch of {rows} rows, not one value per "
    "row: mxoid averages the loss over the batch itself (as trainer.step(batch_size) does), so "
    "a loss already averaged (F.mean(...)) would train with 1/batch_size of its gradient. "
    "Return one value per row, e.g. F.mean(loss, axis=tuple(range(1, ndim))) or a "
    "gluon.loss.Loss, which averages over every axis but the batch's"
)
OTHER_TYPE = (
    "the training data's input {name!r} is {dtype}, but the block's parameters are {params}: "
    "cast the samples (e.g. dataset.transform_first(lambda x: x.astype({params!r})), or "
    "X.astype({params!r}) for an ArrayDataset), or cast the block to the input's type "
    "(net.cast({dtype!r}))"
)
SCORES_NOT_PROBABILITIES = (
    "the metric {metric!r} reads probabilities, but the block's output {output!r} holds the "
    "scores (logits) {loss} turns into log-probabilities itself: it would record NaN or a "
    "wrong number. Its cross-entropy is the metric 'loss' on the output 'loss' "
    "(metrics={{{output!r}: 'acc', 'loss': 'loss'}}, records train_loss / valid_loss)"
)
PROBABILITY_METRICS = ("cross_entropy", "nll_loss", "perplexity")
NO_LOSS = (
    "a Gluon network needs its loss: MainLoop(net, train_data, "
    "loss=gluon.loss.SoftmaxCrossEntropyLoss(), ...)"
)


def is_block(network: Any) -> bool:
    """Return whether ``network`` is a Gluon block (which the loop traces)."""
    return isinstance(network, gluon.Block)


def _positional_inputs(block: gluon.HybridBlock) -> int:
    """Return how many arrays ``block`` takes.

    Its hybrid_forward's arguments after ``F`` that are not its parameters and have no
    default.
    """
    parameters = list(inspect.signature(block.hybrid_forward).parameters.values())[1:]
    own = set(getattr(block, "_reg_params", {}))
    return sum(
        1
        for p in parameters
        if p.name not in own
        and p.default is inspect.Parameter.empty
        and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    )


def input_names(block: gluon.HybridBlock, loss: gluon.HybridBlock) -> Tuple[List[str], List[str]]:
    """Return the default (data names, label names) of ``block`` trained with ``loss``."""
    inputs = max(_positional_inputs(block), 1)
    labels = max(_positional_inputs(loss) - 1, 0)

    def names(base: str, count: int) -> List[str]:
        return [base] if count == 1 else [f"{base}{i}" for i in range(count)]

    return names("data", inputs), names("label", labels)


def _check(network: Any, loss: Any) -> None:
    if not isinstance(network, gluon.HybridBlock):
        raise TypeError(NOT_HYBRID.format(what=f"the network ({type(network).__name__})"))
    if loss is None:
        raise TypeError(NO_LOSS)
    if not isinstance(loss, gluon.HybridBlock):
        what = f"the loss ({type(loss).__name__})"
        if isinstance(loss, gluon.Block):
            raise TypeError(NOT_HYBRID.format(what=what))
        raise TypeError(
            f"{what} must be a gluon.HybridBlock such as gluon.loss.SoftmaxCrossEntropyLoss(), "
            "called as loss(output, label) and returning one value per row"
        )


def _outputs(traced: Any) -> List[mx.sym.Symbol]:
    if isinstance(traced, (list, tuple)):
        return [s for item in traced for s in _outputs(item)]
    return [traced[i] for i in range(len(traced.list_outputs()))]


def _same_graph(a: mx.sym.Symbol, b: mx.sym.Symbol) -> bool:
    """Return whether two traces are one graph (the versions of mutated inputs aside)."""

    def plain(symbol: mx.sym.Symbol) -> Any:
        graph = json.loads(symbol.tojson())
        nodes = [
            (n["op"], n["name"], n.get("attrs"), [i[:2] for i in n["inputs"]])
            for n in graph["nodes"]
        ]
        return nodes, [h[:2] for h in graph["heads"]]

    return plain(a) == plain(b)


class GluonNetwork(Network):
    """A HybridBlock and its loss, traced (see the module's documentation).

    Parameters
    ----------
    block : gluon.HybridBlock
        The network; initialized or not (``initialize()`` with deferred shapes
        is finished here, as Gluon's first forward pass would).
    loss : gluon.HybridBlock
        Called as ``loss(*outputs, *labels)``; one value per row.
    data_descs : list of DataDesc
        The training inputs (their shapes finish deferred initialization).
    label_names : list of str
        The loss's label inputs.
    initializer : mx.init.Initializer, optional
        For a block never initialized (Gluon's default initializer otherwise).
    train_data : mx.io.DataIter, optional
        The training iterator, as the loop reads it.
    precision : mxoid.precision.MixedPrecision, optional
        How the graphs compute: both traces converted (the block's parameters
        stay float32).

    Attributes
    ----------
    symbol : mx.sym.Symbol
        The graph traced in training mode, with the loss: what the loop trains.
    evaluation_symbol : mx.sym.Symbol or None
        The graph traced in predict mode, where it differs from the training
        graph (a branch on ``autograd.is_training()``): what the loop evaluates
        and predicts with (:meth:`graph`).
    parameters : dict of str to gluon.Parameter
        The block's parameters by name (the graph's argument names).
    """

    def __init__(
        self,
        block: gluon.HybridBlock,
        loss: gluon.HybridBlock,
        data_descs: Sequence[Any],
        label_names: Sequence[str],
        initializer: Optional[mx.init.Initializer] = None,
        train_data: Any = None,
        precision: Any = None,
    ) -> None:
        _check(block, loss)
        self.precision = precision
        self.block, self.loss = block, loss
        self.data_names = [_desc_name(d) for d in data_descs]
        self.label_names = list(label_names)
        _check_types(block, data_descs)
        self._finish_initialization(data_descs, initializer)
        train, self.output_names = self._trace(autograd.train_mode)
        _check_per_row(train, data_descs, getattr(train_data, "provide_label", None))
        predict, _ = self._trace(autograd.predict_mode)
        inputs = self.data_names + self.label_names
        super().__init__(self.converted(train, inputs), train_data)
        self.evaluation_symbol = (
            None if _same_graph(train, predict) else self.converted(predict, inputs)
        )
        self.prediction = mx.sym.Group(self._raw_outputs)  # predict mode, for net-symbol.json
        self.parameters = {p.name: p for p in block.collect_params().values()}
        self._short_sets: Dict[Any, ExecutorSet] = {}
        if isinstance(train_data, DataLoaderIter):
            train_data.keep_short = True  # its short last batch at its real size
            self.switches_graphs = True

    def _finish_initialization(
        self, data_descs: Sequence[Any], initializer: Optional[mx.init.Initializer]
    ) -> None:
        params = list(self.block.collect_params().values())
        never = [p for p in params if p._data is None and p._deferred_init == ()]
        if never:
            self.block.initialize(initializer or mx.init.Uniform(), force_reinit=False)
        if any(p._data is None for p in params):  # deferred shapes: one forward, as Gluon's first
            context = params[0].list_ctx()[0]
            inputs = [
                mx.nd.zeros((1,) + tuple(_desc_shape(d)[1:]), ctx=context, dtype=_desc_dtype(d))
                for d in data_descs
            ]
            with autograd.predict_mode():
                self.block(*inputs)

    def _trace(self, mode: Any) -> Tuple[mx.sym.Symbol, List[str]]:
        for param in self.block.collect_params().values():
            # Gluon caches a Parameter's symbol at its first trace (a deferred shape's
            # inference, a hybridized call), its lr_mult / wd_mult as they were then:
            # traced afresh, the graph carries the values Gluon's Trainer reads now.
            param._var = None
        data = [mx.sym.var(name) for name in self.data_names]
        labels = [mx.sym.var(name) for name in self.label_names]
        with mode():
            outputs = _outputs(self.block(*data))
            value = self.loss(*outputs, *labels)
        if isinstance(value, (list, tuple)) or len(value.list_outputs()) != 1:
            raise ValueError("the loss must return one array (one value per row), not several")
        names = [OUTPUT] if len(outputs) == 1 else [f"{OUTPUT}{i}" for i in range(len(outputs))]
        self._raw_outputs = outputs
        heads = [mx.sym.BlockGrad(o, name=n) for o, n in zip(outputs, names)]
        return mx.sym.Group(heads + [mx.sym.MakeLoss(value, name=LOSS)]), names

    def graph(
        self, key: Any = None, data_descs: Any = None, label_descs: Any = None
    ) -> mx.sym.Symbol:
        """Return the graph that evaluates and predicts: traced in predict mode."""
        return self.symbol if self.evaluation_symbol is None else self.evaluation_symbol

    def check_metrics(self, bound: Sequence[Tuple[str, Any]]) -> None:
        """Refuse a probability metric (``'ce'``...) on the scores a softmax cross-entropy takes.

        ``gluon.loss.SoftmaxCrossEntropyLoss`` takes scores (logits, or
        log-probabilities with ``from_logits=True``), not probabilities: the
        cross-entropy of those is the metric ``'loss'``.
        """
        if not isinstance(self.loss, gluon.loss.SoftmaxCrossEntropyLoss):
            return
        for output, metric in bound:
            if output in self.output_names and metric.name in PROBABILITY_METRICS:
                raise ValueError(
                    SCORES_NOT_PROBABILITIES.format(
                        metric=metric.name, output=output, loss=type(self.loss).__name__
                    )
                )

    def key_of(self, batch: Any) -> Any:
        """Return None, or for a short batch kept at its real size ``('rows', real_rows)``."""
        if getattr(batch, "short", False):
            return ("rows", batch.provide_data[0].shape[0])
        return None

    def training_set(
        self, manager: DataParallelExecutorManager, batch: Any, ask_heads: AskHeads
    ) -> ExecutorSet:
        """Return the training set, or for a short batch executors of its rows, bound once."""
        key = self.key_of(batch)
        if key is None:
            return manager.training_set
        found = self._short_sets.get(key)
        if found is None:
            data, labels = batch.provide_data, batch.provide_label
            heads, owners = ask_heads(self.symbol, data, labels, key)
            found = self._short_sets[key] = manager.executor_set(
                data,
                labels,
                heads,
                key=key,
                symbol=self.symbol,
                for_training=True,
                head_owners=owners,
            )
        return found

    # ------------------------------------------------------------ parameters
    def loop_settings(
        self,
        arg_params: Optional[Dict[str, mx.nd.NDArray]],
        aux_params: Optional[Dict[str, mx.nd.NDArray]],
        fixed_param_names: Optional[Sequence[str]],
    ) -> Tuple[Dict[str, mx.nd.NDArray], Dict[str, mx.nd.NDArray], List[str]]:
        """Return the loop's initial values and fixed parameters: the block's, then those given."""
        args, aux = self.initial_params()
        fixed = set(fixed_param_names or ()) | set(self.fixed_param_names())
        return {**args, **(arg_params or {})}, {**aux, **(aux_params or {})}, sorted(fixed)

    def initial_params(self) -> Tuple[Dict[str, mx.nd.NDArray], Dict[str, mx.nd.NDArray]]:
        """Return the block's values ``(arg_params, aux_params)`` by the graph's names."""
        args, aux = set(self.symbol.list_arguments()), set(self.symbol.list_auxiliary_states())
        arg_params, aux_params = {}, {}
        for name, param in self.parameters.items():
            if name in args:
                arg_params[name] = param.data(param.list_ctx()[0])
            elif name in aux:
                aux_params[name] = param.data(param.list_ctx()[0])
        return arg_params, aux_params

    def fixed_param_names(self) -> List[str]:
        """Return the parameters with ``grad_req='null'`` that the graph takes as arguments."""
        args = set(self.symbol.list_arguments())
        return sorted(n for n, p in self.parameters.items() if p.grad_req == "null" and n in args)

    def give_back(self, get_params: Any) -> None:
        """Set the block's parameters to the trained values: it is the model.

        At every epoch's end (before the ``after_epoch`` hooks), at every
        checkpoint (:meth:`checkpoint_files`) and when training ends: an
        extension or a user reading ``net`` then reads the model as trained.
        """
        self.write_back(*get_params())

    def write_back(
        self, arg_params: Dict[str, mx.nd.NDArray], aux_params: Dict[str, mx.nd.NDArray]
    ) -> None:
        """Set the block's parameters (on each of their contexts) to these values."""
        for name, param in self.parameters.items():
            value = arg_params.get(name, aux_params.get(name))
            if value is not None:
                param.set_data(value)

    # ------------------------------------------------------------ checkpoints
    def state(self) -> Dict[str, Any]:
        """Return each parameter's name by its place in the block (``net.params``' keys).

        A checkpoint keeps it, so that another instance of the block, whose
        parameters Gluon named with another prefix, resumes from it
        (:meth:`checkpoint_names`).
        """
        return {STRUCTURE: {place: param.name for place, param in self._by_structure().items()}}

    def checkpoint_names(self, contents: Any) -> Dict[str, str]:
        """Return the checkpoint's names of parameters named otherwise here, matched by place.

        A second model-zoo network in one process names its parameters
        ``resnetv11_...`` where the first's checkpoint has ``resnetv10_...``:
        each is the parameter at the same place in the block (``features.0.weight``,
        Gluon's ``_collect_params_with_prefix``), so it resumes under the new names.
        """
        saved = contents.loop_state.get(STRUCTURE)
        if not isinstance(saved, dict):
            return {}  # a checkpoint of mxoid 0.4, or of a symbol: names as they are
        here = {place: param.name for place, param in self._by_structure().items()}
        return {
            old: here[place]
            for place, old in saved.items()
            if place in here and isinstance(old, str) and old != here[place]
        }

    def _by_structure(self) -> Dict[str, gluon.Parameter]:
        return dict(self.block._collect_params_with_prefix())

    def checkpoint_files(
        self, arg_params: Dict[str, mx.nd.NDArray], aux_params: Dict[str, mx.nd.NDArray]
    ) -> Dict[str, Any]:
        """Return file name -> writer(path) of what Gluon loads from a checkpoint folder.

        ``net.params``: ``block.save_parameters``'s file (``block.load_parameters``);
        ``net-symbol.json``: the block's graph in predict mode, which
        ``gluon.SymbolBlock.imports('net-symbol.json', data_names,
        'model-<epoch>.params')`` loads with the checkpoint's parameters. The
        block is set to these values too (:meth:`give_back`).
        """
        self.write_back(arg_params, aux_params)
        values = {**aux_params, **arg_params}
        by_structure = {
            structure: values[param.name]
            for structure, param in self._by_structure().items()
            if param.name in values
        }
        return {
            "net.params": lambda path: mx.nd.save(path, by_structure),
            "net-symbol.json": lambda path: self.prediction.save(path),
        }


def network_inputs(
    network: Any,
    train_data: Any,
    loss: Any,
    initializer: Optional[mx.init.Initializer],
    precision: Any = None,
) -> Tuple[Any, Any, Optional[GluonNetwork]]:
    """Return ``(network, train_data, gluon)`` as the loop takes them.

    A Gluon block becomes its training graph (``gluon``: the traced
    :class:`GluonNetwork`), its inputs named after ``train_data``'s; a symbol or a
    ``sym_gen`` is returned as it is, with ``gluon`` None. Kept from mxoid 0.4:
    :func:`mxoid.network.as_network` answers for every kind now.
    """
    if not is_block(network):
        if loss is not None:
            raise TypeError(
                "loss= is for a Gluon block; a symbol carries its loss (SoftmaxOutput, MakeLoss)"
            )
        if isinstance(train_data, gluon.data.DataLoader) and isinstance(network, mx.sym.Symbol):
            labels = [n for n in network.list_arguments() if n.endswith("_label")]
            train_data = as_data_iter(train_data, ["data"], labels)
        return network, train_data, None
    _check(network, loss)
    train_data = as_data_iter(train_data, *input_names(network, loss))
    labels = [_desc_name(d) for d in train_data.provide_label or ()]
    traced = GluonNetwork(
        network, loss, list(train_data.provide_data), labels, initializer, train_data, precision
    )
    return traced.symbol, train_data, traced


def _check_types(block: gluon.HybridBlock, data_descs: Sequence[Any]) -> None:
    """Refuse float inputs of another type than the block's float parameters, naming the cast."""
    kinds = {np.dtype(p.dtype).name for p in block.collect_params().values() if p.dtype}
    floats = sorted(k for k in kinds if k.startswith("float"))
    if len(floats) != 1:
        return
    for desc in data_descs:
        dtype = np.dtype(_desc_dtype(desc)).name
        if dtype.startswith("float") and dtype != floats[0]:
            raise TypeError(OTHER_TYPE.format(name=_desc_name(desc), dtype=dtype, params=floats[0]))


def _check_per_row(symbol: mx.sym.Symbol, data_descs: Sequence[Any], label_descs: Any) -> None:
    """Refuse a loss that does not return one value per row (an average, say)."""
    shapes = {_desc_name(d): _desc_shape(d) for d in list(data_descs) + list(label_descs or ())}
    try:
        _, (*_, shape), _ = symbol.infer_shape_partial(**shapes)
    except mx.base.MXNetError:
        return  # the binding says what is wrong
    rows = _desc_shape(data_descs[0])[0]
    if shape and all(shape) and shape[0] != rows:  # () or a 0: not known here
        raise ValueError(NOT_PER_ROW.format(shape=tuple(shape), rows=rows))


def _desc_name(desc: Any) -> str:
    return desc[0] if isinstance(desc, tuple) else desc.name


def _desc_shape(desc: Any) -> Tuple[int, ...]:
    return tuple(desc[1] if isinstance(desc, tuple) else desc.shape)


def _desc_dtype(desc: Any) -> Any:
    return getattr(desc, "dtype", "float32")
