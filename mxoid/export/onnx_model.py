"""A trained network as an ONNX model, checked against MXNet in onnxruntime.

:func:`export_onnx` writes what :meth:`mxoid.MainLoop.predict` computes to an
ONNX file with MXNet 1.9.1's own exporter (``mx.onnx``), then proves it:
``onnx.checker`` checks the file, and onnxruntime runs it on the same inputs
as MXNet's forward pass, at the exported batch size and at a second one; the
largest difference is returned and logged (logger ``mxoid.export``), and a
difference beyond ``tolerance`` is an error.

What mxoid does around MXNet's exporter:

- the graph is the prediction graph (:mod:`mxoid.export.graphs`): loss layers
  replaced by what they compute at inference, outputs that read labels left
  out; the exporter fails on the training graph;
- the model declares opset 13 (or 12), the highest the 1.9.1 exporter writes
  operators for; left alone it declares the installed onnx's newest opset,
  which some of its operators do not follow;
- ``BatchNorm(fix_gamma=True)`` is exported with the gamma MXNet uses (1),
  not the stored one, which the exporter would read;
- the weights are initializers only, not graph inputs too (so runtimes fold
  them as constants), and the batch axis of each input is named ``batch``;
- an operator the exporter cannot convert is an :class:`OnnxExportError`
  naming it, its layer, the exporter's reason and what to do, before any
  file is written where it can be told beforehand.

The batch axis is dynamic (``dynamic_batch=True``) where the graph allows it:
where MXNet cannot run the graph at another batch size (a ``Reshape`` to a
fixed batch, say), or onnxruntime fails or differs there, the file is written
again for the exported batch size only, and the result says why.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any, Dict, Hashable, List, Optional, Sequence, Tuple

import mxnet as mx
import numpy as np

from .graphs import PredictionGraph, exporter_ready, fixed_gamma_names
from .sources import prediction_graphs

__all__ = ["DEFAULT_OPSET", "ONNX_EXTRA", "OnnxExport", "OnnxExportError", "export_onnx"]

logger = logging.getLogger("mxoid.export")

DEFAULT_OPSET = 13
OPSETS = (12, 13)
ONNX_EXTRA = (
    "exporting to ONNX needs {missing}: pip install 'mxoid[onnx]' (onnx below 1.19, whose "
    "onnx.mapping MXNet 1.9.1's exporter uses, and onnxruntime)"
)
UNSUPPORTED = (
    "MXNet 1.9.1's ONNX exporter has no converter for {which}. Rewrite those layers with "
    "operators it converts (mx.onnx.get_operator_support({opset}) lists them) and export "
    "again, or serve the network with MXNet (mxoid.Predictor, or mxoid.quantize for int8)"
)
CANNOT_CONVERT = (
    "MXNet 1.9.1's ONNX exporter cannot convert the operator {op} (layer {name!r}): {reason}. "
    "Change that layer's settings to ones the exporter converts, or serve the network with "
    "MXNet (mxoid.Predictor, or mxoid.quantize for int8)"
)
REFUSED = (
    "onnx.checker refuses the model MXNet's exporter wrote ({path}): {error}. The exporter "
    "converts an operator of that node wrongly: change that layer, or serve the network "
    "with MXNet (mxoid.Predictor, or mxoid.quantize for int8)"
)
CANNOT_RUN = (
    "onnxruntime cannot run the model MXNet's exporter wrote ({path}): {error}. The exporter "
    "converts an operator of that layer wrongly: change that layer, or serve the network "
    "with MXNet (mxoid.Predictor, or mxoid.quantize for int8)"
)
DIFFERS = (
    "the ONNX model {path} computes other values than MXNet: output {output!r} {how} at "
    "batch size {batch}: the exporter converts an operator wrongly. The file is kept for "
    "inspection; serve the network with MXNet (mxoid.Predictor, or mxoid.quantize for int8)"
)


class OnnxExportError(ValueError):
    """The network cannot be exported to ONNX as it is (the message says why and what to do)."""


@dataclass
class OnnxExport:
    """One ONNX file written by :func:`export_onnx`, and how it was checked.

    Attributes
    ----------
    path : str
    inputs : dict of str to tuple
        Each input's shape; ``'batch'`` where the batch axis is dynamic.
    outputs : list of str
        The outputs, as :meth:`mxoid.MainLoop.predict` names them.
    dynamic_batch : bool
    max_difference : float
        The largest absolute difference between onnxruntime's outputs and
        MXNet's forward pass on the same inputs, over ``batch_sizes``.
    batch_sizes : tuple of int
        The batch sizes checked.
    opset : int
    key : hashable or None
        The bucket key of the graph (None: a network of one graph).
    dropped : dict of str to str
        The network's outputs left out (they read labels), and why.
    note : str
        Why the batch axis is fixed although a dynamic one was asked for ('' otherwise).
    """

    path: str
    inputs: Dict[str, Tuple[Any, ...]]
    outputs: List[str]
    dynamic_batch: bool
    max_difference: float
    batch_sizes: Tuple[int, ...]
    opset: int
    key: Optional[Hashable] = None
    dropped: Dict[str, str] = field(default_factory=dict)
    note: str = ""


def export_onnx(
    source: Any,
    path: os.PathLike[str] | str,
    *,
    input_shapes: Any = None,
    dynamic_batch: bool = True,
    opset: Optional[int] = None,
    tolerance: float = 1e-4,
) -> List[OnnxExport]:
    """Write ``source``'s prediction graph to ONNX at ``path``; check it in onnxruntime.

    Parameters
    ----------
    source : str, path-like, MainLoop or gluon.HybridBlock
        A checkpoint folder, a directory of checkpoints (its newest whole
        one), a Module checkpoint prefix, a loop (as it stands) or a block
        (see :mod:`mxoid.export.sources`).
    path : str or path-like
        The file to write. A bucketed loop writes one file per bucket key,
        ``<stem>-<key><suffix>`` (``lm-10.onnx``, ``lm-20.onnx``...): its
        ``sym_gen`` unrolls a graph per key, and no one graph has a dynamic
        sequence axis.
    input_shapes : dict, list or tuple, optional
        The data inputs' shapes, batch first (name -> shape); by default the
        training batch's, which a loop and mxoid's checkpoints know. Needed
        for a block and a Module prefix.
    dynamic_batch : bool, default True
        Make the batch axis dynamic where the graph allows (the module's
        documentation says how that is decided).
    opset : int, optional
        12 or 13 (default), the opsets MXNet 1.9.1's exporter writes.
    tolerance : float, default 1e-4
        The largest difference allowed between onnxruntime and MXNet, relative
        to the largest output value (at least 1).

    Returns
    -------
    list of OnnxExport
        One per file written: one, or one per bucket key, the default first.

    Raises
    ------
    OnnxExportError
        An operator the exporter cannot convert, or outputs that differ.
    ImportError
        Without onnx (below 1.19) or onnxruntime (``pip install 'mxoid[onnx]'``).

    Examples
    --------
    .. code-block:: python

        exported = mxoid.export_onnx("checkpoints", "model.onnx")[0]
        print(exported.inputs, exported.max_difference)   # {'data': ('batch', 64)} 3e-08
    """
    _require()
    opset = DEFAULT_OPSET if opset is None else int(opset)
    if opset not in OPSETS:
        raise ValueError(f"opset {opset}: MXNet 1.9.1's exporter writes opsets {OPSETS}")
    graphs = prediction_graphs(source, input_shapes)
    paths = _paths(os.fspath(path), graphs)
    return [_export(g, p, dynamic_batch, opset, tolerance) for g, p in zip(graphs, paths)]


def _require() -> None:
    missing = []
    for name in ("onnx", "onnxruntime"):
        try:
            __import__(name)
        except ImportError:
            missing.append(name)
    if missing:
        raise ImportError(ONNX_EXTRA.format(missing=" and ".join(missing)))
    import onnx

    if not hasattr(onnx, "mapping"):
        raise ImportError(
            f"onnx {onnx.__version__} has no onnx.mapping (removed in 1.19), which MXNet "
            "1.9.1's exporter uses: pip install 'onnx<1.19' (or 'mxoid[onnx]')"
        )


def _paths(path: str, graphs: Sequence[PredictionGraph]) -> List[str]:
    if len(graphs) == 1:
        return [path]
    stem, suffix = os.path.splitext(path)
    return [f"{stem}-{graph.key}{suffix or '.onnx'}" for graph in graphs]


def _export(
    graph: PredictionGraph, path: str, dynamic: bool, opset: int, tolerance: float
) -> OnnxExport:
    _check_operators(graph.symbol, opset)
    batch = int(graph.inputs[0].shape[0])
    other = 1 if batch != 1 else 2
    note = ""
    if dynamic:
        try:
            graph.forward(_sample(graph, other))
        except (mx.base.MXNetError, ValueError):  # shapes it cannot infer, or other weights
            dynamic, note = False, f"MXNet cannot run the graph at batch size {other}"
    if dynamic:
        try:
            _write(graph, path, opset, dynamic)
            difference, failure = _compare(path, graph, (batch, other), tolerance)
        except OnnxExportError as error:  # the checker, with the batch axis unknown
            failure = (batch, str(error))
        if failure is not None:  # the exported batch size alone, then
            dynamic, note = False, f"with a dynamic batch axis, at batch size {failure[0]}: "
            note += failure[1]
    if not dynamic:
        _write(graph, path, opset, dynamic)
        difference, failure = _compare(path, graph, (batch,), tolerance)
    if failure is not None:
        raise OnnxExportError(failure[1])
    sizes = (batch, other) if dynamic else (batch,)
    exported = OnnxExport(
        path=path,
        inputs={
            d.name: (("batch",) if dynamic else (batch,)) + tuple(d.shape[1:]) for d in graph.inputs
        },
        outputs=list(graph.output_names),
        dynamic_batch=dynamic,
        max_difference=difference,
        batch_sizes=sizes,
        opset=opset,
        key=graph.key,
        dropped=dict(graph.dropped),
        note=note,
    )
    logger.info(
        "wrote %s (opset %d, inputs %s, outputs %s): onnxruntime matches MXNet within %.3g at "
        "batch sizes %s%s",
        path,
        opset,
        exported.inputs,
        exported.outputs,
        difference,
        ", ".join(map(str, sizes)),
        f"; the batch axis is fixed: {note}" if note else "",
    )
    return exported


def _check_operators(symbol: mx.sym.Symbol, opset: int) -> None:
    import json

    supported = set(mx.onnx.get_operator_support(opset))
    lacking: Dict[str, List[str]] = {}
    for node in json.loads(symbol.tojson())["nodes"]:
        if node["op"] != "null" and node["op"] not in supported:
            lacking.setdefault(node["op"], []).append(node["name"])
    if lacking:
        which = "; ".join(
            f"the operator {op} (layers {', '.join(map(repr, names[:3]))}"
            f"{', ...' if len(names) > 3 else ''})"
            for op, names in lacking.items()
        )
        raise OnnxExportError(UNSUPPORTED.format(which=which, opset=opset))


def _write(graph: PredictionGraph, path: str, opset: int, dynamic: bool) -> None:
    import onnx

    model = _convert(graph, opset, dynamic)
    _tidy(model, dynamic)
    onnx.save(model, path)
    try:
        onnx.checker.check_model(path, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as error:
        message = " ".join(str(error).split())
        raise OnnxExportError(REFUSED.format(path=path, error=message)) from None


def _convert(graph: PredictionGraph, opset: int, dynamic: bool) -> Any:
    import onnx
    from mxnet.onnx.mx2onnx._export_onnx import MXNetGraph
    from onnx import helper

    params = dict(graph.params)
    for name in fixed_gamma_names(graph.symbol):  # MXNet computes with 1, whatever is stored
        params[name] = mx.nd.ones_like(params[name])
    by_name = {d.name: d for d in graph.inputs}
    order = [by_name[n] for n in graph.symbol.list_inputs() if n not in params]
    shapes = [tuple(d.shape) for d in order]
    types = [helper.np_dtype_to_tensor_dtype(np.dtype(d.dtype)) for d in order]
    dynamic_shapes = [(None, *s[1:]) for s in shapes] if dynamic else None
    original = MXNetGraph.convert_layer
    converting: Dict[str, Any] = {}

    def convert_layer(node: Dict[str, Any], **kwargs: Any) -> Any:
        converting["node"] = node
        result = original(node, **kwargs)
        converting.pop("node")
        return result

    MXNetGraph.convert_layer = staticmethod(convert_layer)
    # The exporter checks its graph against the newest opset onnx knows, not the one it
    # writes (ReduceMean's axes became an input in opset 18): the whole model is checked
    # against its own opset once written (_write).
    check_graph, onnx.checker.check_graph = onnx.checker.check_graph, lambda *_, **__: None
    try:
        proto = MXNetGraph().create_onnx_graph_proto(
            exporter_ready(graph.symbol),
            params,
            shapes,
            types,
            opset_version=opset,
            dynamic=dynamic,
            dynamic_input_shapes=dynamic_shapes,
        )
    except Exception as error:  # the exporter's own errors: IndexError, AttributeError...
        node = converting.get("node")
        if node is None:
            raise
        reason = str(error).strip()
        if not isinstance(error, (NotImplementedError, AssertionError)) or not reason:
            reason = f"{type(error).__name__}: {reason}"  # KeyError: 'rrelu'
        raise OnnxExportError(
            CANNOT_CONVERT.format(op=node["op"], name=node["name"], reason=reason)
        ) from None
    finally:
        MXNetGraph.convert_layer = staticmethod(original)
        onnx.checker.check_graph = check_graph
    model = helper.make_model(
        proto,
        opset_imports=[helper.make_opsetid("", opset)],
        producer_name="mxoid",
        producer_version=_version(),
    )
    model.ir_version = helper.find_min_ir_version_for(list(model.opset_import))
    return model


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("mxoid")
    except PackageNotFoundError:  # run from a clone without installing it
        return "unknown"


def _tidy(model: Any, dynamic: bool) -> None:
    """Weights as initializers only, unused ones removed; the batch axis named ``batch``."""
    graph = model.graph
    used = {name for node in graph.node for name in node.input}
    keep = [t for t in graph.initializer if t.name in used]
    del graph.initializer[:]
    graph.initializer.extend(keep)
    weights = {t.name for t in keep}
    inputs = [i for i in graph.input if i.name not in weights]
    del graph.input[:]
    graph.input.extend(inputs)
    if dynamic:
        for value in graph.input:  # the copies extend made
            value.type.tensor_type.shape.dim[0].dim_param = "batch"


def _sample(graph: PredictionGraph, batch: int) -> Dict[str, np.ndarray]:
    """Return inputs for the check: uniform in [0, 1), or token ids below an Embedding's size."""
    import json

    nodes = json.loads(graph.symbol.tojson())["nodes"]
    vocabulary = {
        nodes[node["inputs"][0][0]]["name"]: int(node["attrs"]["input_dim"])
        for node in nodes
        if node["op"] == "Embedding"
    }
    rng = np.random.RandomState(batch)
    arrays = {}
    for desc in graph.inputs:
        shape = (batch, *desc.shape[1:])
        if desc.name in vocabulary:
            values = rng.randint(0, vocabulary[desc.name], shape)
        else:
            values = rng.uniform(0, 1, shape)
        arrays[desc.name] = values.astype(desc.dtype)
    return arrays


def _compare(
    path: str, graph: PredictionGraph, sizes: Sequence[int], tolerance: float
) -> Tuple[float, Optional[Tuple[int, str]]]:
    """Return the largest difference, and the first failure as (batch size, message)."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3  # errors only
    options.intra_op_num_threads = 1  # a check of a few rows: no thread pool spinning
    largest = 0.0
    try:
        session = onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    except Exception as error:  # onnxruntime's own errors (Fail, InvalidGraph...)
        return largest, (sizes[0], CANNOT_RUN.format(path=path, error=str(error).strip()))
    for batch in sizes:
        arrays = _sample(graph, batch)
        expected = graph.forward(arrays)
        try:
            got = session.run(graph.output_names, arrays)
        except Exception as error:  # onnxruntime's own errors (Fail, InvalidArgument...)
            return largest, (batch, CANNOT_RUN.format(path=path, error=str(error).strip()))
        for name, want, have in zip(graph.output_names, expected, got):
            if tuple(want.shape) != tuple(have.shape):
                shapes = f"has the shape {tuple(have.shape)}, MXNet's {tuple(want.shape)},"
                message = DIFFERS.format(path=path, output=name, how=shapes, batch=batch)
                return largest, (batch, message)
            difference = float(np.max(np.abs(want.astype(np.float64) - have))) if want.size else 0.0
            largest = max(largest, difference)
            scale = max(1.0, float(np.max(np.abs(want)))) if want.size else 1.0
            if not difference <= tolerance * scale:
                return largest, (
                    batch,
                    DIFFERS.format(
                        path=path,
                        output=name,
                        how=f"differs by {difference:.3g} (tolerance {tolerance:g}, relative "
                        "to the largest output)",
                        batch=batch,
                    ),
                )
    return largest, None
