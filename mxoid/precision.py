"""Mixed precision: bfloat16 compute on CPUs, float32 parameters and optimizer states.

``MainLoop(..., mixed_precision='bfloat16')`` trains with MXNet's automatic
mixed precision (AMP, ``mx.contrib.amp``): every graph the loop binds (a symbol,
each bucket of a ``sym_gen``, a Gluon block's traces, in training and predict
mode) is converted by ``amp.convert_symbol(graph, target_dtype='bfloat16',
data_names=<the inputs>)``, which puts ``amp_cast`` operators before the
operators of AMP's bfloat16 list (``Convolution``, ``FullyConnected``), lets
the dtype-neutral ones (``Activation``, ``Pooling``, ``BatchNorm`` with float32
gamma, beta and statistics, ``Concat``, ``_add`` ...) run in bfloat16 between them,
and casts back to float32 before the others (softmax, losses, ``Flatten``,
``Reshape``, ``Dropout``, ``RNN``, ``Embedding`` ...). The parameters stay
float32 variables, each read through an ``amp_cast``: their gradients arrive
in float32 (the cast's backward), and the optimizer, its states, the kvstore,
checkpoints and :meth:`~mxoid.MainLoop.get_params` see float32 only, as a
float32 run (no ``multi_precision`` copy is needed: the master weights are
the parameters). Every output of a converted graph is float32, under its own
name. A checkpoint's symbol is the network as given (MXNet saves a symbol
without its ``amp_cast`` nodes): it loads in ``Module`` and
``SymbolBlock.imports`` as a float32 model. :class:`~mxoid.Predictor` takes
the same setting for bfloat16 inference.

Why ``data_names``: without it, ``convert_symbol`` takes every argument
without a ``__dtype__`` attribute for an input, and binding a converted symbol
fails in type inference (``InferType pass cannot decide dtypes for the
following arguments ... fc1_weight: -1``): the parameters, read only through
``amp_cast``, have no type that inference can reach. Given the inputs, AMP marks
the parameters float32.

Where it runs: MXNet 1.9.1 computes bfloat16 on CPUs only, with MKLDNN
(oneDNN), which needs AVX-512 (``avx512bw``; ``avx512_bf16`` or AMX run it
natively, other AVX-512 CPUs emulate it). Elsewhere MKLDNN refuses the first
bfloat16 ``FullyConnected`` with ``could not create a primitive descriptor
iterator``: the loop tries one bfloat16 forward and backward pass when it is
built (:func:`bfloat16_support`) and refuses with a message naming the CPU's
flags. ``'float16'`` is MXNet's GPU precision: its CPU operators refuse it
(``float16 fully connected layer is currently only supported by CuDNN
version``, ``FP16 gemm on cpu not implemented!``), and the loop refuses it on
CPU contexts; on GPUs it converts the graphs the same way, and the loop scales the
loss dynamically by default (:mod:`mxoid.loss_scale`: float16's small gradients would
underflow; bfloat16 has float32's range and needs none).
"""

from __future__ import annotations

import functools
import json
import os
from typing import Any, Iterable, List, Optional, Sequence

import mxnet as mx
import numpy as np

__all__ = [
    "LOW_PRECISION",
    "MixedPrecision",
    "bfloat16_support",
    "check_mixed_precision",
    "cpu_flags",
]

LOW_PRECISION = ("bfloat16", "float16")
"""The compute types ``mixed_precision`` takes (AMP's ``target_dtype``)."""

UNKNOWN = (
    "mixed_precision={value!r}: give 'bfloat16' (CPUs with AVX-512), 'float16' (GPUs) or None "
    "(float32)"
)
BFLOAT16_ON_GPU = (
    "mixed_precision='bfloat16' computes on CPUs only in MXNet 1.9.1 (MKLDNN), but the "
    "contexts include {gpus}: use mixed_precision='float16' on GPUs"
)
FLOAT16_ON_CPU = (
    "mixed_precision='float16' runs on GPUs only: MXNet 1.9.1's CPU operators refuse float16 "
    "('float16 fully connected layer is currently only supported by CuDNN version', 'FP16 "
    "gemm on cpu not implemented!'), and the contexts include {cpus}. On CPUs use "
    "mixed_precision='bfloat16' (AVX-512)"
)
NO_BFLOAT16 = (
    "mixed_precision='bfloat16' needs a CPU on which MXNet's MKLDNN computes bfloat16 "
    "(AVX-512: avx512bw, natively with avx512_bf16 or amx_bf16); here a bfloat16 "
    "FullyConnected failed: {error}. This CPU's flags: {flags}. Train in float32 "
    "(mixed_precision=None), or on such a CPU"
)
_FLAGS = ("avx512f", "avx512bw", "avx512_bf16", "amx_bf16")
_ISA_LIMITS = ("DNNL_MAX_CPU_ISA", "MKLDNN_MAX_CPU_ISA")  # oneDNN's own limit on the ISA it uses


def cpu_flags() -> List[str]:
    """Return which of the flags bfloat16 needs this CPU has (``/proc/cpuinfo``; Linux).

    ``['unknown']`` where the file cannot be read.
    """
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("flags"):
                    have = set(line.split(":", 1)[1].split())
                    return [flag for flag in _FLAGS if flag in have] or ["none of " + str(_FLAGS)]
    except OSError:
        pass
    return ["unknown"]


@functools.cache
def bfloat16_support() -> Optional[str]:
    """Return None where MXNet trains in bfloat16 on this CPU, else MXNet's error.

    One bfloat16 ``FullyConnected`` and ``Convolution``, forward and backward,
    on ``mx.cpu()``; an error is cleared from MXNet's engine (``waitall``),
    which would otherwise raise it again at exit. Once per process.
    """
    bfloat16 = np.dtype([("bfloat16", np.uint16)])
    with mx.autograd.pause():
        x = mx.nd.ones((2, 1, 4, 4))
        w, b, k = mx.nd.ones((3, 16)), mx.nd.zeros((3,)), mx.nd.ones((2, 1, 3, 3))
    for array in (x, w, b, k):
        array.attach_grad()
    try:
        with mx.autograd.record():
            low = [mx.nd.amp_cast(a, dtype=bfloat16) for a in (x, w, b, k)]
            y = mx.nd.FullyConnected(low[0], low[1], low[2], num_hidden=3)
            z = mx.nd.Convolution(low[0], low[3], kernel=(3, 3), num_filter=2, no_bias=True)
            total = (
                mx.nd.amp_cast(y, dtype="float32").sum() + mx.nd.amp_cast(z, dtype="float32").sum()
            )
        total.backward()
        mx.nd.waitall()
        return None
    except mx.base.MXNetError as error:
        try:
            mx.nd.waitall()
        except mx.base.MXNetError:
            pass
        return str(error).strip().splitlines()[-1]


def check_mixed_precision(value: Any, contexts: Sequence[mx.Context]) -> Optional[MixedPrecision]:
    """Return the loop's :class:`MixedPrecision` for ``value`` on ``contexts`` (None: float32).

    Raises ``ValueError`` for an unknown name, bfloat16 on a GPU or on a CPU that
    cannot compute it, float16 on a CPU, each saying what to do.
    """
    if isinstance(value, MixedPrecision):
        value = value.dtype
    if value is None or value == "float32":
        return None
    if value not in LOW_PRECISION:
        raise ValueError(UNKNOWN.format(value=value))
    gpus = [str(c) for c in contexts if c.device_type == "gpu"]
    cpus = [str(c) for c in contexts if c.device_type != "gpu"]
    if value == "bfloat16":
        if gpus:
            raise ValueError(BFLOAT16_ON_GPU.format(gpus=", ".join(gpus)))
        error = bfloat16_support()
        if error is not None:
            flags = ", ".join(cpu_flags())
            limits = [f"{k}={os.environ[k]}" for k in _ISA_LIMITS if os.environ.get(k)]
            if limits:
                flags += f" (MKLDNN limited by {', '.join(limits)})"
            raise ValueError(NO_BFLOAT16.format(error=error, flags=flags))
    elif cpus:
        raise ValueError(FLOAT16_ON_CPU.format(cpus=", ".join(cpus)))
    return MixedPrecision(value)


class MixedPrecision:
    """How the loop's graphs compute: AMP's conversion to ``dtype``, float32 parameters.

    Parameters
    ----------
    dtype : {'bfloat16', 'float16'}
        AMP's ``target_dtype``.
    """

    def __init__(self, dtype: str) -> None:
        if dtype not in LOW_PRECISION:
            raise ValueError(UNKNOWN.format(value=dtype))
        self.dtype = dtype

    def __repr__(self) -> str:
        return f"MixedPrecision({self.dtype!r})"

    def convert(self, symbol: mx.sym.Symbol, input_names: Iterable[str]) -> mx.sym.Symbol:
        """Return ``symbol`` converted by AMP, its arguments but ``input_names`` float32.

        Its outputs keep their names: AMP casts a low-precision output to
        float32 under the name ``<output>_amp_cast_float32``, renamed here to
        the output's own (MXNet drops the cast when the symbol is saved).
        """
        from mxnet.contrib import amp

        arguments = symbol.list_arguments()
        inputs = [name for name in input_names if name in arguments]
        converted = amp.convert_symbol(symbol, target_dtype=self.dtype, data_names=inputs)
        return _outputs_named_as(converted, symbol.list_outputs())


def _outputs_named_as(converted: mx.sym.Symbol, names: Sequence[str]) -> mx.sym.Symbol:
    """Return ``converted`` with each output's cast node renamed so that it outputs ``names``."""
    if converted.list_outputs() == list(names):
        return converted
    graph = json.loads(converted.tojson(remove_amp_cast=False))
    nodes = graph["nodes"]
    for (node, _, _), name, theirs in zip(graph["heads"], names, converted.list_outputs()):
        if name != theirs and nodes[node]["op"] == "amp_cast":
            nodes[node]["name"] = name[: -len("_output")] if name.endswith("_output") else name
    graph.pop("node_row_ptr", None)
    return mx.sym.load_json(json.dumps(graph))
