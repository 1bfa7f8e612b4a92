"""The prediction graph: a trained network's symbol as it computes at inference.

A symbol trained by MXNet ends in loss layers whose forward pass is the
prediction (``SoftmaxOutput`` computes a softmax, ``LinearRegressionOutput``
passes its input on) but whose inputs include the labels, which a served model
does not have, and which exporters cannot read (MXNet 1.9.1's ONNX exporter
fails on ``SoftmaxOutput`` with an ``IndexError``). :func:`prediction_symbol`
replaces each loss layer at an output by what it computes at inference, keeps
the output's name (``softmax_output``: what :meth:`mxoid.MainLoop.predict` calls
``softmax``), and leaves out the outputs that read a label (a ``MakeLoss`` of a
loss, a Gluon network's ``loss``) or one of mxoid's private arrays (the
running sums of :mod:`mxoid.executor_manager.private_heads`).

At an output, each loss layer becomes what it computes at inference:

- ``SoftmaxOutput`` (and ``Softmax``): a ``softmax`` over the classes, axis 1 with
  ``multi_output``, else the last axis. For an input of more than two axes without
  ``preserve_shape``: the last axis where MXNet computes with MKLDNN (its CPU default),
  else every axis but the batch's, as MXNet's own implementation does
  (:func:`mkldnn_softmax_output`);
- ``LogisticRegressionOutput``: a ``sigmoid``;
- ``LinearRegressionOutput``, ``MAERegressionOutput``, ``SVMOutput``, ``MakeLoss``,
  ``make_loss``, ``BlockGrad``: an ``identity``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Dict, Hashable, List, Optional, Sequence, Tuple

import mxnet as mx
import numpy as np

from ..executor_manager.outputs import output_short_name
from ..executor_manager.private_heads import RUNNING_SUMS_PREFIX

__all__ = [
    "LOSS_LAYERS",
    "PredictionGraph",
    "exporter_ready",
    "fixed_gamma_names",
    "is_label",
    "mkldnn_softmax_output",
    "prediction_symbol",
    "shape_of",
    "with_global_pool_kernels",
]

IDENTITY_AT_INFERENCE = (
    "LinearRegressionOutput",
    "MAERegressionOutput",
    "SVMOutput",
    "MakeLoss",
    "make_loss",
    "BlockGrad",
)
LOSS_LAYERS = ("SoftmaxOutput", "Softmax", "LogisticRegressionOutput", *IDENTITY_AT_INFERENCE)
"""The operators replaced at an output by what they compute at inference."""

NO_PREDICTION = (
    "the network has no output to predict with: {reasons}. Export a network whose "
    "outputs do not read the labels (its loss layer's input, say)"
)
_TRUE = ("true", "1")
# MXNet's defaults where MXNet 1.9.1's exporter assumes others (exporter_ready).
EXPORTER_DEFAULTS = {
    "FullyConnected": {"flatten": "True"},
    "LRN": {"alpha": "0.0001", "beta": "0.75", "knorm": "2"},
    "_contrib_box_nms": {"force_suppress": "False"},
}


def is_label(name: str) -> bool:
    """Return whether an input is a label by its name (``softmax_label``, ``label``, ``label0``)."""
    return name.endswith("_label") or name.rstrip("0123456789") == "label"


@dataclass
class PredictionGraph:
    """A network to export or quantize: its prediction symbol, values and inputs.

    Attributes
    ----------
    symbol : mx.sym.Symbol
        The prediction graph (:func:`prediction_symbol`).
    arg_params, aux_params : dict of str to NDArray
        The trained values the graph reads (BatchNorm statistics as
        :meth:`mxoid.MainLoop.get_params` gives them).
    inputs : list of mx.io.DataDesc
        The data inputs, in the graph's order: name, shape (the batch first) and type.
    output_names : list of str
        The outputs, as :meth:`mxoid.MainLoop.predict` names them (``softmax``).
    dropped : dict of str to str
        Outputs of the network left out, and why.
    key : hashable or None
        The bucket key of the graph (None: a network of one graph).
    """

    symbol: mx.sym.Symbol
    arg_params: Dict[str, mx.nd.NDArray]
    aux_params: Dict[str, mx.nd.NDArray]
    inputs: List[mx.io.DataDesc]
    output_names: List[str]
    dropped: Dict[str, str] = field(default_factory=dict)
    key: Optional[Hashable] = None

    @property
    def params(self) -> Dict[str, mx.nd.NDArray]:
        """The arguments and auxiliary states the graph reads, by name."""
        arguments = set(self.symbol.list_arguments())
        aux = set(self.symbol.list_auxiliary_states())
        values = {n: v for n, v in self.arg_params.items() if n in arguments}
        values.update((n, v) for n, v in self.aux_params.items() if n in aux)
        return values

    def forward(self, arrays: Dict[str, np.ndarray]) -> List[np.ndarray]:
        """Return MXNet's outputs for these input arrays (a forward pass for inference, on CPU)."""
        shapes = {name: array.shape for name, array in arrays.items()}
        types = {name: value.dtype for name, value in self.params.items()}
        types.update((name, array.dtype) for name, array in arrays.items())
        executor = self.symbol.simple_bind(mx.cpu(), grad_req="null", type_dict=types, **shapes)
        for name, array in executor.arg_dict.items():
            array[:] = arrays[name] if name in arrays else self.arg_params[name]
        for name, array in executor.aux_dict.items():
            array[:] = self.aux_params[name]
        return [output.asnumpy() for output in executor.forward(is_train=False)]


def shape_of(symbol: mx.sym.Symbol, shapes: Dict[str, Any]) -> Tuple[int, ...]:
    """Return the shape of ``symbol``'s one output, for these input shapes (0: unknown)."""
    arguments = set(symbol.list_arguments())
    known = {name: tuple(shape) for name, shape in shapes.items() if name in arguments}
    _, (shape,), _ = symbol.infer_shape_partial(**known)
    return tuple(shape or ())


def _nodes(symbol: mx.sym.Symbol) -> Tuple[List[Dict[str, Any]], List[List[int]]]:
    graph = json.loads(symbol.tojson())
    return graph["nodes"], graph["heads"]


def _reads(symbol: mx.sym.Symbol, label_names: Sequence[str]) -> List[str]:
    """Return the labels and private arrays among the inputs ``symbol`` reads."""
    labels = set(label_names)
    return [
        name
        for name in symbol.list_inputs()
        if name in labels or is_label(name) or name.startswith(RUNNING_SUMS_PREFIX)
    ]


def mkldnn_softmax_output() -> bool:
    """Return whether MXNet computes ``SoftmaxOutput`` with MKLDNN here (CPU, the default).

    MKLDNN's softmax is over the last axis, also for an input of more than two
    axes without ``preserve_shape`` or ``multi_output``, where MXNet's own
    implementation (GPUs, ``MXNET_MKLDNN_ENABLED=0``) is over every axis but the
    batch's.
    """
    enabled = os.environ.get("MXNET_MKLDNN_ENABLED", "1").strip() not in ("0", "false", "False")
    return enabled and mx.runtime.Features().is_enabled("MKLDNN")


def _softmax(data: mx.sym.Symbol, attrs: Dict[str, str], name: str, shapes: Any) -> mx.sym.Symbol:
    """Return what ``SoftmaxOutput`` computes at inference in this MXNet, on the CPU.

    ``src/operator/softmax_output-inl.h``, and with MKLDNN
    ``src/operator/nn/mkldnn/mkldnn_softmax_output.cc`` (:func:`mkldnn_softmax_output`).
    """
    if str(attrs.get("multi_output", "False")).lower() in _TRUE:
        return mx.sym.softmax(data, axis=1, name=name)
    if str(attrs.get("preserve_shape", "False")).lower() in _TRUE:
        return mx.sym.softmax(data, axis=-1, name=name)
    if len(shape_of(data, shapes)) <= 2 or mkldnn_softmax_output():
        return mx.sym.softmax(data, axis=-1, name=name)
    flat = mx.sym.softmax(mx.sym.reshape(data, shape=(0, -1)), axis=-1)
    return mx.sym.reshape_like(flat, data, name=name)


def _at_inference(
    head: mx.sym.Symbol, node: Dict[str, Any], shapes: Dict[str, Tuple[int, ...]]
) -> mx.sym.Symbol:
    op, name, attrs = node["op"], node["name"], node.get("attrs", {})
    if op not in LOSS_LAYERS:
        return head
    data = head.get_children()[0]
    if op in ("SoftmaxOutput", "Softmax"):
        return _softmax(data, attrs, name, shapes)
    if op == "LogisticRegressionOutput":
        return mx.sym.sigmoid(data, name=name)
    return mx.sym.identity(data, name=name)


def prediction_symbol(
    symbol: mx.sym.Symbol,
    label_names: Sequence[str],
    shapes: Dict[str, Tuple[int, ...]],
    output_names: Optional[Sequence[str]] = None,
) -> Tuple[mx.sym.Symbol, List[str], Dict[str, str]]:
    """Return ``(symbol, output names, dropped)``: ``symbol`` as it predicts.

    Each loss layer at an output is replaced by what it computes at inference
    (the module's table); outputs that read a label (``label_names``, or a name
    such as ``softmax_label``) or a private array are dropped (``dropped``:
    output name -> why). ``shapes``: the data inputs' shapes (a softmax over
    every axis but the batch's needs the input's rank). ``output_names``: the
    names to give the outputs kept, in order (the predict names, ``softmax``,
    by default); each becomes the name of the graph's last node there.

    Raises
    ------
    ValueError
        When every output reads a label.
    """
    nodes, heads = _nodes(symbol)
    kept: List[mx.sym.Symbol] = []
    names: List[str] = []
    dropped: Dict[str, str] = {}
    for index, (node_id, _, *_) in enumerate(heads):
        head = symbol[index]
        name = output_short_name(head.list_outputs()[0])
        replaced = _at_inference(head, nodes[node_id], shapes)
        reads = _reads(replaced, label_names)
        if reads:
            dropped[name] = f"{name!r} reads {', '.join(reads)}"
            continue
        kept.append(replaced)
        names.append(name)
    if not kept:
        raise ValueError(NO_PREDICTION.format(reasons="; ".join(dropped.values())))
    names = names if output_names is None else list(output_names)
    # Each output the one output of a node named after it: what the exporter names it by.
    kept = [
        s if s.list_outputs()[0] == f"{n}_output" else mx.sym.identity(s, name=n)
        for s, n in zip(kept, names)
    ]
    return (kept[0] if len(kept) == 1 else mx.sym.Group(kept)), names, dropped


def exporter_ready(symbol: mx.sym.Symbol) -> mx.sym.Symbol:
    """Return ``symbol`` with the settings MXNet 1.9.1's exporter reads written out.

    Its converters take settings left out for other values than MXNet's
    defaults, and compare booleans to the strings ``'True'`` and ``'1'``:

    - a ``FullyConnected`` without ``flatten`` is not flattened (MXNet flattens
      an input of more than two axes), and fails or computes otherwise;
    - a ``Deconvolution`` without ``no_bias`` is taken to have a bias (MXNet's has
      none): each ``Convolution``, ``Deconvolution`` and ``FullyConnected`` gets
      ``no_bias`` as the layer is built (whether it has a bias input);
    - an ``LRN`` without ``knorm`` gets 1 (MXNet's is 2), and ``box_nms``
      without ``force_suppress`` True (MXNet's is False);
    - ``'true'`` and ``'false'`` are written ``'True'`` and ``'False'``.
    """
    graph = json.loads(symbol.tojson())
    for node in graph["nodes"]:
        if node["op"] == "null":
            continue
        attrs = node.setdefault("attrs", {})
        for name, value in attrs.items():  # its converters compare to 'True' and '1'
            if value in ("true", "false"):
                attrs[name] = value.capitalize()
        for name, value in EXPORTER_DEFAULTS.get(node["op"], {}).items():
            attrs.setdefault(name, value)
        if node["op"] in ("Convolution", "Deconvolution", "FullyConnected"):
            attrs["no_bias"] = str(len(node["inputs"]) == 2)
    return mx.sym.load_json(json.dumps(graph))


def fixed_gamma_names(symbol: mx.sym.Symbol) -> List[str]:
    """Return the gammas of ``BatchNorm(fix_gamma=True)`` layers (MXNet's default).

    MXNet computes those layers with a gamma of 1, whatever value is stored.
    """
    nodes, _ = _nodes(symbol)
    return [
        nodes[node["inputs"][1][0]]["name"]
        for node in nodes
        if node["op"] == "BatchNorm"
        and str(node.get("attrs", {}).get("fix_gamma", "True")).lower() in _TRUE
    ]


def with_global_pool_kernels(symbol: mx.sym.Symbol, shapes: Dict[str, Any]) -> mx.sym.Symbol:
    """Return ``symbol`` with each global pooling's kernel set to its input's size.

    A ``Pooling(global_pool=True)`` ignores its kernel, but MXNet 1.9.1's
    quantized pooling checks it against the input ("kernel size (7) exceeds
    input"), as ResNets written for 32x32 images and run on smaller ones have it.
    What the graph computes does not change.
    """
    graph = json.loads(symbol.tojson())
    internals = symbol.get_internals()
    changed = False
    for node in graph["nodes"]:
        attrs = node.get("attrs", {})
        if node["op"] != "Pooling" or str(attrs.get("global_pool", "False")).lower() not in _TRUE:
            continue
        shape = shape_of(internals[node["name"] + "_output"].get_children()[0], shapes)
        if len(shape) >= 3 and all(shape[2:]):
            attrs["kernel"] = str(tuple(int(s) for s in shape[2:]))
            changed = True
    return mx.sym.load_json(json.dumps(graph)) if changed else symbol
