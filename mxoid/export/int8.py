"""int8 MXNet models: a trained network quantized with MXNet's MKLDNN backend, for serving.

:func:`quantize` takes what :func:`mxoid.export_onnx` takes (a checkpoint, a
loop or a Gluon block), starts from the same prediction graph
(:mod:`mxoid.export.graphs`: loss layers replaced by what they compute at
inference) and quantizes it with MXNet 1.9.1's
``mx.contrib.quantization.quantize_model_mkldnn``: convolutions and fully
connected layers fused with their BatchNorm and activation and run in 8-bit
integers (``quantized_dtype='auto'``: unsigned after a ReLU, signed
elsewhere), the thresholds taken from a few batches of calibration data.
The result saves as a Module checkpoint that :class:`mxoid.Predictor` (and
``mx.mod.Module.load``) loads. MXNet runs it on CPUs with MKLDNN (the
``mxnet`` wheels for Linux have it).

Calibration: ``'naive'`` takes each layer's smallest and largest output over
the calibration batches (fast); ``'entropy'`` chooses thresholds that keep the
distribution of each layer's outputs (KL divergence, as TensorRT does; MXNet
computes it in Python, about 30 s for a ResNet-20 on two CPU cores).

Where MXNet needs the graph adjusted first, :func:`quantize` does it without
changing what the graph computes: a global pooling's kernel is set to its
input's size (MXNet's quantized pooling checks the kernel even where
``global_pool`` ignores it), and ``BatchNorm(fix_gamma=True)`` layers get the
gamma MXNet computes with (1). ``mode='none'`` (no calibration) is not offered:
MXNet's quantized BatchNorm refuses it ("Quantized BN currently don't support
calib_mode=None") wherever a BatchNorm does not follow a convolution.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence

import mxnet as mx
import numpy as np

from ..data.evaluation import random_states_kept
from ..errors import clean_mxnet_message
from .graphs import fixed_gamma_names, with_global_pool_kernels
from .sources import prediction_graphs

__all__ = ["CALIBRATION_MODES", "QuantizedModel", "quantize"]

CALIBRATION_MODES = ("naive", "entropy")
NO_MKLDNN = (
    "this MXNet has no MKLDNN, which int8 quantization needs: install the 'mxnet' wheel "
    "for Linux (pip install mxnet==1.9.1), whose CPU backend is MKLDNN"
)
NO_CALIBRATION = (
    "the calibration data gave no batch: give an iterator (or arrays) of inputs like the "
    "network's {inputs}"
)


@dataclass
class QuantizedModel:
    """An int8 network and its values, as :func:`quantize` returns it.

    Attributes
    ----------
    symbol : mx.sym.Symbol
        The quantized graph (MKLDNN's fused and quantized operators).
    arg_params, aux_params : dict of str to NDArray
    inputs : list of mx.io.DataDesc
        The data inputs (float, as the float32 network takes them).
    output_names : list of str
        As :meth:`mxoid.MainLoop.predict` names them.
    mode : str
        The calibration: ``'naive'`` or ``'entropy'``.
    calibration_samples : int
    quantized_layers : int
        How many operators of the graph run in int8.
    seconds : float
        How long quantizing and calibrating took.
    """

    symbol: mx.sym.Symbol
    arg_params: Dict[str, mx.nd.NDArray]
    aux_params: Dict[str, mx.nd.NDArray]
    inputs: List[mx.io.DataDesc]
    output_names: List[str]
    mode: str
    calibration_samples: int
    quantized_layers: int
    seconds: float
    files: List[str] = field(default_factory=list)

    def save(self, prefix: os.PathLike[str] | str, epoch: int = 0) -> List[str]:
        """Write ``prefix-symbol.json`` and ``prefix-<epoch>.params``; return their paths.

        ``mxoid.Predictor(prefix)`` and ``mx.mod.Module.load(prefix, epoch)`` load them.
        """
        prefix = os.fspath(prefix)
        folder = os.path.dirname(os.path.abspath(prefix))
        os.makedirs(folder, exist_ok=True)
        mx.model.save_checkpoint(prefix, epoch, self.symbol, self.arg_params, self.aux_params)
        self.files = [f"{prefix}-symbol.json", f"{prefix}-{epoch:04d}.params"]
        return list(self.files)


def quantize(
    source: Any,
    calibration_data: Any,
    *,
    mode: str = "naive",
    num_batches: int = 10,
    input_shapes: Any = None,
    output: Optional[os.PathLike[str] | str] = None,
) -> QuantizedModel:
    """Return ``source``'s prediction graph quantized to int8 (see the module's documentation).

    Parameters
    ----------
    source : str, path-like, MainLoop or gluon.HybridBlock
        As :func:`mxoid.export_onnx` takes it. A bucketed network's default
        bucket's graph (the one its checkpoints hold).
    calibration_data : mx.io.DataIter, gluon DataLoader, NumPy array or dict
        Inputs like those the network will serve (a training or validation
        iterator: its labels are not read); arrays are cut into batches of
        the training batch's size (or ``input_shapes``'). Read from its start,
        and reset afterwards.
    mode : {'naive', 'entropy'}
        How the thresholds are chosen (see the module's documentation).
    num_batches : int, default 10
        How many batches of ``calibration_data`` calibrate.
    input_shapes : optional
        As :func:`mxoid.export_onnx` takes them.
    output : str or path-like, optional
        A prefix to save the model to (:meth:`QuantizedModel.save`).

    Examples
    --------
    .. code-block:: python

        int8 = mxoid.quantize("checkpoints", train_iter, output="served/int8")
        probabilities = mxoid.Predictor("served/int8").predict(test_iter)["softmax"]
    """
    if mode not in CALIBRATION_MODES:
        raise ValueError(f"mode={mode!r}: choose one of {CALIBRATION_MODES}")
    if int(num_batches) < 1:
        raise ValueError(f"num_batches must be at least 1, got {num_batches}")
    if not mx.runtime.Features().is_enabled("MKLDNN"):
        raise RuntimeError(NO_MKLDNN)
    from mxnet.contrib.quantization import quantize_model_mkldnn

    graph = prediction_graphs(source, input_shapes)[0]
    calibration = _calibration(calibration_data, graph.inputs, int(num_batches))
    shapes = {d.name: tuple(d.shape) for d in graph.inputs}
    symbol = with_global_pool_kernels(graph.symbol, shapes)
    arg_params = {n: v for n, v in graph.params.items() if n in graph.arg_params}
    for name in fixed_gamma_names(symbol):
        arg_params[name] = mx.nd.ones_like(arg_params[name])
    aux_params = {n: v for n, v in graph.params.items() if n in graph.aux_params}
    started = time.perf_counter()
    try:
        qsym, qargs, qaux = quantize_model_mkldnn(
            symbol,
            arg_params,
            aux_params,
            data_names=[d.name for d in graph.inputs],
            label_names=[],
            ctx=mx.cpu(),
            calib_mode=mode,
            calib_data=calibration,
            num_calib_examples=calibration.num_data,
            quantized_dtype="auto",
            quantize_mode="smart",
        )
    except mx.base.MXNetError as error:
        raise ValueError(
            f"MXNet's int8 quantization failed on this network: {clean_mxnet_message(error)}"
        ) from None
    model = QuantizedModel(
        symbol=_named_outputs(qsym, graph.output_names),
        arg_params=qargs,
        aux_params=qaux,
        inputs=list(graph.inputs),
        output_names=list(graph.output_names),
        mode=mode,
        calibration_samples=calibration.num_data,
        quantized_layers=_quantized_layers(qsym),
        seconds=time.perf_counter() - started,
    )
    if output is not None:
        model.save(output)
    return model


def _named_outputs(symbol: mx.sym.Symbol, names: Sequence[str]) -> mx.sym.Symbol:
    """Return ``symbol`` with its outputs named ``names`` again (fused layers are renamed)."""
    outputs = [symbol[i] for i in range(len(symbol.list_outputs()))]
    named = [
        s if s.list_outputs()[0] == f"{n}_output" else mx.sym.identity(s, name=n)
        for s, n in zip(outputs, names)
    ]
    return named[0] if len(named) == 1 else mx.sym.Group(named)


def _quantized_layers(symbol: mx.sym.Symbol) -> int:
    count = 0
    for node in json.loads(symbol.tojson())["nodes"]:
        attrs = node.get("attrs", {})
        if node["op"].startswith("_contrib_quantized_") or (
            node["op"].startswith("_sg_mkldnn_") and str(attrs.get("quantized")).lower() == "true"
        ):
            count += 1
    return count


def _calibration(
    data: Any, inputs: Sequence[mx.io.DataDesc], num_batches: int
) -> mx.io.NDArrayIter:
    """Return ``num_batches`` batches of ``data``'s inputs as an iterator of data alone."""
    names = [d.name for d in inputs]
    batch_size = int(inputs[0].shape[0])
    if isinstance(data, np.ndarray) or isinstance(data, mx.nd.NDArray):
        data = {names[0]: data}
    if isinstance(data, dict):
        arrays = {n: _numpy(data[n])[: num_batches * batch_size] for n in names}
    else:
        with random_states_kept():  # a shuffling iterator's reset draws from them
            arrays = _read_batches(data, names, num_batches)
    if not arrays or len(next(iter(arrays.values()))) == 0:
        raise ValueError(NO_CALIBRATION.format(inputs=[(d.name, d.shape) for d in inputs]))
    rows = len(next(iter(arrays.values())))
    return mx.io.NDArrayIter(
        {n: a.astype(d.dtype) for (n, a), d in zip(arrays.items(), inputs)},
        batch_size=min(batch_size, rows),
        last_batch_handle="discard" if rows >= batch_size else "pad",
    )


def _numpy(array: Any) -> np.ndarray:
    return array.asnumpy() if isinstance(array, mx.nd.NDArray) else np.asarray(array)


def _read_batches(data: Any, names: Sequence[str], num_batches: int) -> Dict[str, np.ndarray]:
    """Read the first ``num_batches`` batches' data arrays of an iterator or a DataLoader."""
    parts: Dict[str, List[np.ndarray]] = {n: [] for n in names}
    is_iterator = isinstance(data, mx.io.DataIter)
    if is_iterator:
        data.reset()
    try:
        for index, batch in enumerate(data):
            if index == num_batches:
                break
            if is_iterator:
                arrays = batch.data
                real = batch.data[0].shape[0] - (batch.pad or 0)
            else:
                arrays = list(batch) if isinstance(batch, (list, tuple)) else [batch]
                real = arrays[0].shape[0]
            for name, array in zip(names, arrays):
                parts[name].append(_numpy(array)[:real])
    finally:
        if is_iterator:
            data.reset()
    return {n: np.concatenate(p) for n, p in parts.items() if p}
