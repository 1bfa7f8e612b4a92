"""The ways out of MXNet for serving: ONNX files and int8 MXNet models.

- :func:`export_onnx` (:mod:`.onnx_model`): a checkpoint, a loop or a Gluon
  block to an ONNX file, checked in onnxruntime against MXNet's forward pass;
- :func:`quantize` (:mod:`.int8`): the same sources to an int8 symbol and
  parameters (MXNet's MKLDNN quantization), which :class:`mxoid.Predictor` loads;
- :mod:`.graphs` and :mod:`.sources`: the prediction graph both start from;
- :mod:`.commands`: ``mxoid export`` and ``mxoid quantize``.

Nothing here imports onnx until an export runs.
"""

from ..lazy import lazy_exports

_EXPORTS = {
    "OnnxExport": "onnx_model",
    "OnnxExportError": "onnx_model",
    "QuantizedModel": "int8",
    "export_onnx": "onnx_model",
    "prediction_graphs": "sources",
    "quantize": "int8",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
