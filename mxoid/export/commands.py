"""``mxoid export`` and ``mxoid quantize``: from the checkpoint you have to a served model.

::

    mxoid export checkpoints -o model.onnx                 # the newest whole checkpoint
    mxoid export checkpoints/checkpoint-000004-epoch0004-batch00000188 -o model.onnx
    mxoid export prefix --input-shape data=1,3,32,32 -o model.onnx   # a Module checkpoint
    mxoid quantize checkpoints --calibration inputs.npy -o served/int8

``mxoid export`` writes the ONNX file (:func:`mxoid.export_onnx`) and prints
its inputs and outputs and how far onnxruntime's outputs are from MXNet's.
``mxoid quantize`` writes an int8 Module checkpoint (:func:`mxoid.quantize`)
that ``mxoid.Predictor(PREFIX)`` loads; its calibration inputs come from a
``.npy`` file (the network's one input) or a ``.npz`` file (an array per
input name). :mod:`mxoid.cli` registers both; nothing here loads MXNet until
one runs.
"""

from __future__ import annotations

import argparse
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..errors import InputError

__all__ = ["add_commands", "export_command", "parse_input_shapes", "quantize_command"]

SOURCE_HELP = (
    "an mxoid checkpoint folder, a Checkpoint directory (its newest whole checkpoint) or a "
    "Module checkpoint prefix (PREFIX-symbol.json, PREFIX-NNNN.params)"
)
SHAPE_HELP = (
    "an input's shape, batch first (repeat for several inputs); by default the training "
    "batch's, which mxoid's checkpoints record"
)


def add_commands(commands: Any) -> None:
    """Add ``export`` and ``quantize`` to the ``mxoid`` command's subparsers."""
    export = commands.add_parser(
        "export",
        help="write a trained network to ONNX, checked against MXNet in onnxruntime",
        description="Write the network of a checkpoint as it predicts (loss layers replaced by "
        "what they compute at inference) to an ONNX file (opset 13) with MXNet's exporter, "
        "check it with onnx.checker and run it in onnxruntime against MXNet's forward pass at "
        "two batch sizes; print the largest difference. Needs mxoid[onnx].",
    )
    export.add_argument("source", metavar="SOURCE", help=SOURCE_HELP)
    export.add_argument("-o", "--output", required=True, metavar="FILE", help="the .onnx file")
    export.add_argument(
        "--input-shape", action="append", metavar="NAME=D0,D1,...", dest="shapes", help=SHAPE_HELP
    )
    export.add_argument(
        "--fixed-batch", action="store_true", help="keep the batch size of the input shapes"
    )
    export.add_argument("--opset", type=int, choices=(12, 13), default=13, help="default: 13")
    export.add_argument(
        "--tolerance",
        type=float,
        default=1e-4,
        help="the largest difference from MXNet allowed, relative to the largest output "
        "(default: %(default)s)",
    )
    export.set_defaults(handler=export_command)

    quantize = commands.add_parser(
        "quantize",
        help="write an int8 version of a trained network (MXNet's MKLDNN quantization)",
        description="Quantize the network of a checkpoint to int8 with MXNet's MKLDNN backend, "
        "calibrated on inputs from a .npy (one input) or .npz (arrays by input name) file, and "
        "write it as a Module checkpoint OUT-symbol.json, OUT-0000.params, which "
        "mxoid.Predictor(OUT) loads.",
    )
    quantize.add_argument("source", metavar="SOURCE", help=SOURCE_HELP)
    quantize.add_argument("-o", "--output", required=True, metavar="OUT", help="the prefix")
    quantize.add_argument(
        "--calibration", required=True, metavar="FILE", help="inputs: a .npy or .npz file"
    )
    quantize.add_argument(
        "--mode", choices=("naive", "entropy"), default="naive", help="default: naive"
    )
    quantize.add_argument(
        "--num-batches", type=int, default=10, metavar="N", help="calibration batches (10)"
    )
    quantize.add_argument(
        "--input-shape", action="append", metavar="NAME=D0,D1,...", dest="shapes", help=SHAPE_HELP
    )
    quantize.set_defaults(handler=quantize_command)


def parse_input_shapes(items: Optional[Sequence[str]]) -> Optional[Dict[str, Tuple[int, ...]]]:
    """Return ``{'data': (1, 3, 32, 32)}`` for ``['data=1,3,32,32']`` (None for none)."""
    if not items:
        return None
    shapes = {}
    for item in items:
        name, _, dims = item.partition("=")
        try:
            shape = tuple(int(d) for d in dims.split(","))
        except ValueError:
            shape = ()
        if not name or not shape or min(shape) < 1:
            raise InputError(f"--input-shape {item!r}: write NAME=D0,D1,... (data=1,3,32,32)")
        shapes[name.strip()] = shape
    return shapes


def _errors() -> Tuple[type, ...]:
    from ..checkpoint.format import CheckpointError

    return (ValueError, TypeError, FileNotFoundError, CheckpointError, ImportError, RuntimeError)


def export_command(args: argparse.Namespace) -> int:
    """Write SOURCE's network to an ONNX file and print how it was checked."""
    from .onnx_model import export_onnx

    shapes = parse_input_shapes(args.shapes)
    try:
        exported = export_onnx(
            args.source,
            args.output,
            input_shapes=shapes,
            dynamic_batch=not args.fixed_batch,
            opset=args.opset,
            tolerance=args.tolerance,
        )
    except _errors() as error:
        raise InputError(str(error)) from None
    for result in exported:
        inputs = ", ".join(f"{n} {_shape(s)}" for n, s in result.inputs.items())
        sizes = " and ".join(map(str, result.batch_sizes))
        print(
            f"wrote {result.path}: inputs {inputs}; outputs {', '.join(result.outputs)}; "
            f"onnxruntime matches MXNet within {result.max_difference:.2g} at batch sizes {sizes}"
        )
        for why in result.dropped.values():
            print(f"  left out the output {why} (a loss needs the labels)")
        if result.note:
            print(f"  the batch axis is fixed: {result.note}")
    return 0


def _shape(shape: Sequence[Any]) -> str:
    return "(" + ", ".join(map(str, shape)) + ")"


def _calibration(path: str) -> Any:
    import numpy as np

    try:
        loaded = np.load(path)
    except (OSError, ValueError) as error:
        raise InputError(f"{path}: cannot read calibration inputs ({error})") from None
    if isinstance(loaded, np.ndarray):
        return loaded
    with loaded:
        return {name: loaded[name] for name in loaded.files}


def quantize_command(args: argparse.Namespace) -> int:
    """Write SOURCE's network quantized to int8 and print what was done."""
    from .int8 import quantize

    shapes = parse_input_shapes(args.shapes)
    data = _calibration(args.calibration)
    try:
        model = quantize(
            args.source,
            data,
            mode=args.mode,
            num_batches=args.num_batches,
            input_shapes=shapes,
            output=args.output,
        )
    except _errors() as error:
        raise InputError(str(error)) from None
    files: List[str] = model.files
    print(
        f"quantized {model.quantized_layers} operators to int8 ({model.mode} calibration on "
        f"{model.calibration_samples} samples, {model.seconds:.1f} s); wrote "
        f"{', '.join(files)}; load it with mxoid.Predictor({args.output!r})"
    )
    return 0
