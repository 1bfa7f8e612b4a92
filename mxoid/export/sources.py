"""What can be exported: a checkpoint, a loop or a Gluon block, as prediction graphs.

:func:`prediction_graphs` turns each kind of source into
:class:`~mxoid.export.graphs.PredictionGraph` objects, one per graph:

- a checkpoint folder, a directory of checkpoints (its newest whole
  checkpoint) or a Module checkpoint prefix (:func:`mxoid.load_params` takes
  the same): the saved network and values. The inputs' shapes are the
  training batch's, which checkpoints of mxoid 0.5 record (``inputs`` in
  ``loop.json``); older ones, and Module prefixes, need ``input_shapes``. A
  Gluon block's checkpoint is exported from its predict-mode graph
  (``net-symbol.json``), whose outputs are named ``output`` as the loop's. A
  bucketed run's checkpoint holds its default bucket's graph only (MXNet's
  format): that graph is exported;
- a :class:`~mxoid.MainLoop`: the graphs it predicts with, as they stand
  (:meth:`~mxoid.MainLoop.get_params`: BatchNorm statistics averaged over the
  devices), one per bucket key the network knows (the default bucket's first);
  another bucket's inputs are the default bucket's shapes with the default
  key's length replaced by the key's (as ``BucketSentenceIter``'s batches are);
- a Gluon ``HybridBlock`` (initialized): traced in predict mode on inputs
  named ``data`` (``data0``, ``data1``... for several, or the names of
  ``input_shapes``), whose shapes ``input_shapes`` gives.
"""

from __future__ import annotations

import os
from typing import Any, Dict, Hashable, List, Optional, Sequence, Tuple

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

from ..checkpoint.directory import is_checkpoint_folder
from ..checkpoint.loading import checkpoint_of_epoch, load_model
from ..checkpoint.reading import read_checkpoint
from ..errors import clean_mxnet_message
from ..loss_scale import without_loss_scale
from .graphs import PredictionGraph, is_label, prediction_symbol

__all__ = ["INPUTS_STATE", "prediction_graphs"]

INPUTS_STATE = "inputs"
"""The record of ``loop.json`` holding the training batch's data inputs: ``[name, shape, type]``
(:func:`mxoid.main_loop.state.input_state`)."""
GLUON_GRAPH = "net-symbol.json"
NO_SHAPES = (
    "the shapes of the inputs {names} are not known: {why}. Give them, batch first: "
    "input_shapes={example} (on the command line: --input-shape {flag})"
)
OTHER_SHAPES = (
    "the network cannot take inputs of the shapes {shapes}: {error}. Give the shapes it "
    "was trained on, batch first (input_shapes=..., or --input-shape NAME=D0,D1,...)"
)
UNINITIALIZED = (
    "the block's parameters {names} are not initialized: call net.initialize() (or "
    "load_parameters) and run it once on an input, as before any prediction"
)

Shapes = Dict[str, Tuple[int, ...]]


def prediction_graphs(source: Any, input_shapes: Any = None) -> List[PredictionGraph]:
    """Return the prediction graphs of ``source`` (see the module's documentation).

    ``input_shapes``: the data inputs' shapes, batch first: a dict of name to
    shape, a list of shapes in the inputs' order, or one shape for one input.
    Given, they replace the recorded ones.
    """
    from ..main_loop import MainLoop

    if isinstance(source, MainLoop):
        return _loop_graphs(source, input_shapes)
    if isinstance(source, gluon.HybridBlock):
        return [_block_graph(source, input_shapes)]
    if isinstance(source, gluon.Block):
        raise TypeError(
            "a gluon.Block runs Python in its forward and cannot be traced to a graph: make it "
            "a gluon.HybridBlock"
        )
    if isinstance(source, (str, os.PathLike)):
        return [_saved_graph(os.fspath(source), input_shapes)]
    raise TypeError(
        "export a checkpoint folder or directory, a Module checkpoint prefix, a MainLoop or a "
        f"gluon.HybridBlock, not {type(source).__name__}"
    )


def _given(input_shapes: Any, names: Sequence[str]) -> Shapes:
    if input_shapes is None:
        return {}
    if isinstance(input_shapes, dict):
        unknown = sorted(set(input_shapes) - set(names))
        if unknown:
            raise ValueError(f"input_shapes names {unknown}; the network's inputs are {names}")
        return {name: tuple(int(s) for s in shape) for name, shape in input_shapes.items()}
    shapes = list(input_shapes)
    if shapes and all(isinstance(s, (int, np.integer)) for s in shapes):
        shapes = [shapes]
    if len(shapes) != len(names):
        raise ValueError(f"{len(shapes)} input shapes for the {len(names)} inputs {names}")
    return {name: tuple(int(s) for s in shape) for name, shape in zip(names, shapes)}


def _descs(
    names: Sequence[str], recorded: Dict[str, Tuple[Tuple[int, ...], Any]], given: Shapes, why: str
) -> List[mx.io.DataDesc]:
    missing = [n for n in names if n not in given and n not in recorded]
    if missing:
        example = "{" + ", ".join(f"{n!r}: (1, ...)" for n in missing) + "}"
        flag = " ".join(f"{n}=1,..." for n in missing)
        raise ValueError(NO_SHAPES.format(names=missing, why=why, example=example, flag=flag))
    descs = []
    for name in names:
        shape, dtype = recorded.get(name, (None, "float32"))
        descs.append(mx.io.DataDesc(name, given.get(name, shape), np.dtype(dtype)))
    return descs


def _graph(
    symbol: mx.sym.Symbol,
    params: Tuple[Dict[str, mx.nd.NDArray], Dict[str, mx.nd.NDArray]],
    descs: List[mx.io.DataDesc],
    labels: Sequence[str],
    output_names: Optional[Sequence[str]] = None,
    key: Optional[Hashable] = None,
) -> PredictionGraph:
    shapes = {d.name: tuple(d.shape) for d in descs}
    try:
        known = set(symbol.list_arguments())
        values = {n: v.shape for n, v in params[0].items() if n in known}
        symbol.infer_shape_partial(**values, **{n: s for n, s in shapes.items() if n in known})
    except mx.base.MXNetError as error:
        raise ValueError(
            OTHER_SHAPES.format(shapes=shapes, error=clean_mxnet_message(error))
        ) from None
    predict, names, dropped = prediction_symbol(symbol, labels, shapes, output_names)
    inputs = set(predict.list_inputs())
    used = [d for d in descs if d.name in inputs]
    return PredictionGraph(predict, params[0], params[1], used, names, dropped, key)


# ---------------------------------------------------------------- a loop
def _loop_graphs(loop: Any, input_shapes: Any) -> List[PredictionGraph]:
    params = loop.get_params()
    network, manager = loop.network, loop.manager
    trained = manager.training_set.data_descs
    given = _given(input_shapes, [d.name for d in trained])
    default = [mx.io.DataDesc(d.name, given.get(d.name, tuple(d.shape)), d.dtype) for d in trained]
    graphs = []
    for key in network.graph_keys:
        descs = _bucket_descs(default, network.default_key, key)
        symbol = network.graph(key, descs, manager.training_set.label_descs)
        symbol = without_loss_scale(symbol)  # the network as given (mxoid.loss_scale)
        graphs.append(_graph(symbol, params, descs, manager.label_names, key=key))
    return graphs


def _bucket_descs(
    default: List[mx.io.DataDesc], default_key: Any, key: Any
) -> List[mx.io.DataDesc]:
    """Return bucket ``key``'s inputs: the default's, its key's length replaced by ``key``."""
    if key == default_key or not isinstance(key, int) or not isinstance(default_key, int):
        return default
    return [
        mx.io.DataDesc(
            d.name, (d.shape[0], *(key if s == default_key else s for s in d.shape[1:])), d.dtype
        )
        for d in default
    ]


# --------------------------------------------------------------- a block
def _block_graph(block: gluon.HybridBlock, input_shapes: Any) -> PredictionGraph:
    if input_shapes is None:
        raise ValueError(
            NO_SHAPES.format(
                names=["data"],
                why="a Gluon block does not record them",
                example="(1, 3, 32, 32)",
                flag="data=1,3,32,32",
            )
        )
    if isinstance(input_shapes, dict):
        names = list(input_shapes)
    else:
        count = 1 if _flat(input_shapes) else len(input_shapes)
        names = ["data"] if count == 1 else [f"data{i}" for i in range(count)]
    shapes = _given(input_shapes, names)
    parameters = list(block.collect_params().values())
    _finish_initialization(block, parameters, shapes)
    with autograd.predict_mode():
        traced = block(*[mx.sym.var(name) for name in names])
    outputs = _flatten(traced)
    output_names = ["output"] if len(outputs) == 1 else [f"output{i}" for i in range(len(outputs))]
    symbol = mx.sym.Group(outputs) if len(outputs) > 1 else outputs[0]
    arguments, aux = set(symbol.list_arguments()), set(symbol.list_auxiliary_states())
    values = {p.name: p.data(p.list_ctx()[0]) for p in parameters}
    params = (
        {n: v for n, v in values.items() if n in arguments},
        {n: v for n, v in values.items() if n in aux},
    )
    descs = [mx.io.DataDesc(n, shapes[n], np.dtype(_float_type(parameters))) for n in names]
    return _graph(symbol, params, descs, [], output_names)


def _flat(shapes: Any) -> bool:
    return all(isinstance(s, (int, np.integer)) for s in shapes)


def _flatten(traced: Any) -> List[mx.sym.Symbol]:
    if isinstance(traced, (list, tuple)):
        return [s for item in traced for s in _flatten(item)]
    return [traced[i] for i in range(len(traced.list_outputs()))]


def _float_type(parameters: Sequence[gluon.Parameter]) -> str:
    kinds = {np.dtype(p.dtype).name for p in parameters if p.dtype is not None}
    floats = sorted(k for k in kinds if k.startswith("float"))
    return floats[0] if len(floats) == 1 else "float32"


def _finish_initialization(
    block: gluon.HybridBlock, parameters: Sequence[gluon.Parameter], shapes: Shapes
) -> None:
    never = [p.name for p in parameters if p._data is None and p._deferred_init == ()]
    if never:
        raise ValueError(UNINITIALIZED.format(names=never[:5]))
    if any(p._data is None for p in parameters):  # deferred shapes: one forward, as Gluon's first
        context = parameters[0]._deferred_init[1][0]
        dtype = _float_type(parameters)
        with autograd.predict_mode():
            block(*[mx.nd.zeros((1,) + s[1:], ctx=context, dtype=dtype) for s in shapes.values()])


# ---------------------------------------------------------- a checkpoint
def _saved_graph(path: str, input_shapes: Any) -> PredictionGraph:
    full = os.path.abspath(path)
    state: Dict[str, Any] = {}
    output_names = None
    if os.path.isdir(full):
        folder = full if is_checkpoint_folder(full) else checkpoint_of_epoch(full)
        contents = read_checkpoint(folder)
        symbol = mx.sym.load_json(contents.symbol_json)
        arg_params, aux_params = contents.arg_params, contents.aux_params
        state = contents.loop_state
        gluon_graph = os.path.join(folder, GLUON_GRAPH)
        if os.path.isfile(gluon_graph):  # a block's: its predict-mode graph, outputs 'output'
            symbol = mx.sym.load(gluon_graph)
            count = len(symbol.list_outputs())
            output_names = ["output"] if count == 1 else [f"output{i}" for i in range(count)]
        why = f"the checkpoint {folder} does not record them (written before mxoid 0.5)"
    else:
        symbol, arg_params, aux_params = load_model(path)
        why = "a Module checkpoint does not record them"
    recorded = {name: (tuple(shape), dtype) for name, shape, dtype in state.get(INPUTS_STATE, [])}
    known = set(arg_params) | set(aux_params)
    inputs = [n for n in symbol.list_arguments() if n not in known]
    names = [n for n in inputs if n in recorded or not is_label(n)]
    labels = [n for n in inputs if n not in names]
    descs = _descs(names, recorded, _given(input_shapes, names), why)
    key = state.get("default_bucket_key")
    return _graph(symbol, (arg_params, aux_params), descs, labels, output_names, key)
