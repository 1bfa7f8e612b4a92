"""MXNet 1.9.1 on today's Python and NumPy: the names it needs that newer releases removed.

MXNet 1.9.1, the last 1.x release, was built for NumPy < 1.24 and Python <= 3.11.
It computes the same on NumPy 1.24 to 2.x and Python 3.12 and 3.13 once a few names
it uses at import time or later exist again. :func:`apply` adds them, and only them:
it never replaces a name that exists.

What it touches
---------------
- ``numpy``: ``bool`` (removed in 1.24; the builtin ``bool``), and for NumPy 2.x
  ``PZERO``, ``NZERO``, ``PINF``, ``NINF``, ``NAN``, ``NaN``, ``Inf``, ``alltrue``,
  ``sometrue``, ``product``, ``round_``, ``msort``, ``in1d``, ``trapz`` (2.4+), the
  values or functions they were; and the financial functions of NEP 32 (``mirr``,
  ``npv``, ``pmt``, ``ppmt``, ``pv``, ``rate``) as functions that raise, saying to
  use ``numpy-financial``.
- ``distutils.version`` on Python 3.12+, where ``distutils`` is gone and setuptools
  may be absent; and where it does import, the file MXNet's import would run, lent to
  that import alone (:mod:`mxoid.distutils_version`).
- ``mxnet.recordio.pack`` and ``pack_img`` on NumPy 2.3+, which removed
  ``ndarray.tostring``: the same record format, written with ``tobytes``.
- ``scipy.sparse.csr`` where SciPy no longer has it (MXNet reads
  ``scipy.sparse.csr.csr_matrix``): ``csr_matrix`` under that name.
- ``mxnet.contrib.quantization._get_optimal_threshold`` on NumPy 1.25+, where
  turning an array of one element into a number is deprecated (an error in
  NumPy 2.x): the same thresholds, as numbers, so that int8 quantization with
  ``calib_mode='entropy'`` (:func:`mxoid.quantize`) runs.

When it runs
------------
``import mxoid`` applies it. So that a script may start with ``import mxnet``, the
package installs a start-up file (``mxoid-mxnet-compat.pth`` in ``site-packages``)
that calls :func:`install_import_hook`: a finder that applies the NumPy and
distutils names just before MXNet is first imported, and fixes ``mxnet.recordio``,
``mxnet.ndarray.utils`` and ``mxnet.contrib.quantization`` right after they load.
Until MXNet is imported it
costs nothing (it imports nothing), and finding MXNet without importing it
(``importlib.util.find_spec("mxnet")``, as a parameter-server scheduler does to
locate ``libmxnet.so``) changes nothing either. The same finder serves MXNet's operator functions
from a cache while MXNet is imported (:mod:`mxoid.operator_cache`: ``import mxnet`` in
about half the CPU time; ``MXOID_OPERATOR_CACHE=0`` turns that alone off). Set
``MXOID_NO_COMPAT=1`` to turn all of it off.
"""

from __future__ import annotations

import builtins
import importlib.abc
import importlib.machinery
import importlib.util
import math
import numbers
import os
import struct
import sys
import types
import warnings
from typing import Any, Callable, Dict, Optional

__all__ = ["DISABLE", "apply", "install_import_hook", "patch_quantization", "patch_recordio"]

DISABLE = "MXOID_NO_COMPAT"
"""The environment variable that turns the compatibility layer off (any non-empty value)."""

FINANCIAL = ("mirr", "npv", "pmt", "ppmt", "pv", "rate")


def _disabled() -> bool:
    return bool(os.environ.get(DISABLE))


def _financial(name: str) -> Callable[..., Any]:
    def removed(*args: Any, **kwargs: Any) -> Any:
        raise AttributeError(
            f"numpy.{name} was removed in NumPy 1.20 (NEP 32); use numpy_financial.{name} "
            "(pip install numpy-financial)"
        )

    removed.__name__ = name
    return removed


def _numpy_names(np: Any) -> Dict[str, Any]:
    """Return the names MXNet 1.9.1 uses, as they were in the NumPy it was built for."""

    def in1d(ar1: Any, ar2: Any, assume_unique: bool = False, invert: bool = False) -> Any:
        return np.isin(ar1, ar2, assume_unique=assume_unique, invert=invert).ravel()

    names: Dict[str, Any] = {
        "bool": builtins.bool,
        "PZERO": 0.0,
        "NZERO": -0.0,
        "PINF": math.inf,
        "NINF": -math.inf,
        "NAN": math.nan,
        "NaN": math.nan,
        "Inf": math.inf,
        "alltrue": np.all,
        "sometrue": np.any,
        "product": np.prod,
        "round_": np.round,
        "msort": lambda a: np.sort(a, axis=0),
        "in1d": in1d,
    }
    if hasattr(np, "trapezoid"):
        names["trapz"] = np.trapezoid
    names.update((name, _financial(name)) for name in FINANCIAL)
    return names


def _add_missing(module: Any, names: Dict[str, Any]) -> None:
    for name, value in names.items():
        if name in vars(module):
            continue
        with warnings.catch_warnings():  # NumPy warns about the names it removed
            warnings.simplefilter("ignore")
            try:
                getattr(module, name)
            except AttributeError:
                setattr(module, name, value)


def apply() -> None:
    """Add the names MXNet 1.9.1 needs and this Python or NumPy lacks; change nothing else.

    Idempotent; does nothing when ``MXOID_NO_COMPAT`` is set. Patches MXNet's own
    modules too (:func:`patch_recordio`) when they are already imported.
    """
    if _disabled():
        return
    import numpy

    _add_missing(numpy, _numpy_names(numpy))
    _start_up_module("distutils_version").provide()
    if "mxnet.recordio" in sys.modules:
        patch_recordio(sys.modules["mxnet.recordio"])
    if "mxnet.ndarray.utils" in sys.modules:
        _patch_sparse(sys.modules["mxnet.ndarray.utils"])
    if "mxnet.contrib.quantization" in sys.modules:
        patch_quantization(sys.modules["mxnet.contrib.quantization"])


def patch_recordio(recordio: Any) -> None:
    """Give ``mxnet.recordio`` a ``pack`` and ``pack_img`` that work on NumPy 2.3+.

    NumPy 2.3 removed ``ndarray.tostring``, which MXNet's own call; the records
    are byte for byte the same.
    """
    import numpy as np

    if hasattr(np.ndarray, "tostring") or getattr(recordio, "_mxoid_patched", False):
        return
    header_format = recordio._IR_FORMAT

    def pack(header: Any, s: bytes) -> bytes:
        header = recordio.IRHeader(*header)
        if isinstance(header.label, numbers.Number):
            header = header._replace(flag=0)
        else:
            label = np.asarray(header.label, dtype=np.float32)
            header = header._replace(flag=label.size, label=0)
            s = label.tobytes() + s
        return struct.pack(header_format, *header) + s

    def pack_img(header: Any, img: Any, quality: int = 95, img_fmt: str = ".jpg") -> bytes:
        import cv2

        encoding = {
            ".jpg": [cv2.IMWRITE_JPEG_QUALITY, quality],
            ".jpeg": [cv2.IMWRITE_JPEG_QUALITY, quality],
            ".png": [cv2.IMWRITE_PNG_COMPRESSION, quality],
        }
        ok, buffer = cv2.imencode(img_fmt, img, encoding.get(img_fmt.lower(), []))
        if not ok:
            raise ValueError(f"cannot encode the image as {img_fmt}")
        return pack(header, buffer.tobytes())

    pack.__doc__ = recordio.pack.__doc__
    pack_img.__doc__ = recordio.pack_img.__doc__
    recordio.pack, recordio.pack_img = pack, pack_img
    recordio._mxoid_patched = True


def patch_quantization(quantization: Any) -> None:
    """Make entropy calibration's thresholds numbers on NumPy 1.25+ (see the module's notes).

    ``_get_optimal_threshold`` returns the threshold and divergence as arrays of
    one element, which MXNet then converts to C floats: deprecated in NumPy 1.25,
    an error in NumPy 2.x. The values are the same.
    """
    import numpy as np

    if np.lib.NumpyVersion(np.__version__) < "1.25.0":
        return
    if getattr(quantization, "_mxoid_patched", False):
        return
    original = quantization._get_optimal_threshold

    def _get_optimal_threshold(
        hist_data: Any, quantized_dtype: Any, num_quantized_bins: int = 255
    ) -> Any:
        low, high, threshold, divergence = original(hist_data, quantized_dtype, num_quantized_bins)
        return low, high, float(np.ravel(threshold)[0]), float(np.ravel(divergence)[0])

    _get_optimal_threshold.__doc__ = original.__doc__
    quantization._get_optimal_threshold = _get_optimal_threshold
    quantization._mxoid_patched = True


def _patch_sparse(utils: Any) -> None:
    sparse = getattr(utils, "spsp", None)
    if sparse is not None and "csr" not in vars(sparse):
        try:
            getattr(sparse, "csr")  # noqa: B009  (SciPy 1.x: a deprecated module, still there)
        except AttributeError:
            sparse.csr = types.SimpleNamespace(csr_matrix=sparse.csr_matrix)


_STARTED: Dict[str, Any] = {}  # mxoid's modules loaded by their path at start-up


def _start_up_module(name: str) -> Any:
    """Return mxoid's module ``name`` (standard library only).

    Loaded by its path where mxoid is not imported: at start-up neither mxoid nor MXNet
    is imported yet.
    """
    module = sys.modules.get(f"mxoid.{name}") or _STARTED.get(name)
    if module is not None:
        return module
    where = os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"mxoid_{name}_at_start_up", where)
    if spec is None or spec.loader is None:
        return None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    _STARTED[name] = module
    return module


def _operator_cache() -> Any:
    """Return an :class:`mxoid.operator_cache.OperatorCache` for this import; None where off."""
    module = _start_up_module("operator_cache")
    if module is None or not module.enabled():
        return None
    return module.OperatorCache()


def _deferred_imports() -> Any:
    """Return :mod:`mxoid.deferred_imports`; None where off."""
    module = _start_up_module("deferred_imports")
    if module is None or not module.enabled():
        return None
    return module


_AFTER_IMPORT = {
    "mxnet.recordio": patch_recordio,
    "mxnet.ndarray.utils": _patch_sparse,
    "mxnet.contrib.quantization": patch_quantization,
}


class _MXNetImportHook(importlib.abc.MetaPathFinder):
    """Apply the NumPy names before MXNet is first imported; fix MXNet's modules after.

    ``mxnet.recordio``, ``mxnet.ndarray.utils`` and ``mxnet.contrib.quantization`` are
    patched right after they load.
    """

    operators: Any = None  # the OperatorCache of the import of MXNet under way
    importing = False  # MXNet's import runs: its imports of requests and onnx are deferred
    lent: Any = None  # the distutils.version lent to MXNet's import, until it is taken back
    deferred: Any = None  # mxoid.deferred_imports, once MXNet's import has used it

    def find_spec(
        self, fullname: str, path: Any = None, target: Any = None
    ) -> Optional[importlib.machinery.ModuleSpec]:
        if _disabled():
            return None
        if not fullname.startswith("mxnet"):
            if self.deferred is None:
                return None
            return self.deferred.find_spec(fullname, path, target, self.importing)
        if fullname == "mxnet":  # prepared when MXNet runs: a find_spec alone changes nothing
            return self._wrapped(
                fullname,
                path,
                target,
                before=self._begin,
                after=self._save_operators,
                settle=self._take_back,
            )
        if fullname in _AFTER_IMPORT:
            return self._wrapped(fullname, path, target, after=_AFTER_IMPORT[fullname])
        if self.operators is not None and fullname in self.operators.modules:
            return self._wrapped(fullname, path, target, before=self._give_exec)
        if self.operators is not None and fullname == "mxnet.base":
            return self._wrapped(fullname, path, target, after=self._serve_sources)
        return None

    def _wrapped(
        self,
        fullname: str,
        path: Any,
        target: Any,
        before: Any = None,
        after: Any = None,
        settle: Any = None,
    ) -> Optional[importlib.machinery.ModuleSpec]:
        """Return the spec PathFinder finds, its loader wrapped.

        It runs ``before`` the module, ``after`` it once it has loaded, and ``settle``
        whether it (or ``before``) loaded or raised. Finding the spec runs none of them.
        """
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            try:
                if before is not None:
                    before(module)
                run(module)
            finally:
                if settle is not None:
                    settle(module)
            if after is not None:
                after(module)

        spec.loader.exec_module = exec_module
        return spec

    def _begin(self, module: Any) -> None:
        """MXNet's import starts: its names, the operator cache, deferral, distutils lent."""
        apply()
        self.operators = _operator_cache()
        self.deferred = self.deferred or _deferred_imports()
        self.importing = True
        self.lent = _start_up_module("distutils_version").lend()

    def _serve_sources(self, module: Any) -> None:
        try:
            self.operators.serve(module)
        except Exception:  # noqa: BLE001  (then MXNet writes every source, as without)
            self.operators.restore()
            self.operators.serve_sources(None)

    def _give_exec(self, module: Any) -> None:
        if self.operators is not None:
            module.__dict__["exec"] = self.operators.exec

    def _take_back(self, module: Any) -> None:
        if self.operators is not None:
            self.operators.restore()
        lent, self.lent, self.importing = self.lent, None, False
        _start_up_module("distutils_version").take_back(lent)

    def _save_operators(self, module: Any) -> None:
        operators, self.operators = self.operators, None
        if operators is not None:
            operators.save()


def install_import_hook() -> None:
    """Install the finder of the module documentation (once); the start-up file calls it."""
    if _disabled():
        return
    if not any(isinstance(finder, _MXNetImportHook) for finder in sys.meta_path):
        sys.meta_path.insert(0, _MXNetImportHook())
    if "mxnet" in sys.modules:  # imported before: fix what can still be fixed
        apply()
