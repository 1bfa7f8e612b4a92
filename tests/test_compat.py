"""MXNet 1.9.1 on today's Python and NumPy: whatever is imported first, only missing names
added, RecordIO with array labels, and a switch to turn it off."""

import json
import os
import re
import subprocess
import sys
import types

import numpy as np
import pytest

from mxoid import compat, distutils_version

NUMPY_2 = int(np.__version__.split(".")[0]) >= 2


def python(code, *args, **env):
    done = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "MXNET_SUBGRAPH_VERBOSE": "0", **env},
    )
    return done.returncode, done.stdout + done.stderr


FIRST_MXNET = """
import mxnet as mx
import numpy as np
import mxoid
from mxoid import FinishAfter, MainLoop
X = np.random.RandomState(0).rand(40, 5).astype('float32')
y = (X[:, 0] > 0.5).astype('float32')
data = mx.sym.Variable('data')
net = mx.sym.SoftmaxOutput(mx.sym.FullyConnected(data, num_hidden=2, name='fc'), name='softmax')
loop = MainLoop(net, mx.io.NDArrayIter(X, y, batch_size=10),
                extensions=[FinishAfter(after_n_epochs=2)]).run()
print('trained', loop.status.iterations_done, np.__version__)
"""


def test_a_script_that_imports_mxnet_first_works():
    code, out = python(FIRST_MXNET)
    assert code == 0 and "trained 8" in out, out


def test_the_start_up_file_installs_the_hook_in_every_interpreter():
    code, out = python("import sys; print([type(f).__name__ for f in sys.meta_path])")
    assert code == 0 and "_MxoidStartUpHook" in out, out
    code, out = python("import sys; print([m in sys.modules for m in ('numpy', 'mxnet', 'mxoid')])")
    assert out.strip() == "[False, False, False]"  # it imports nothing until MXNet is imported


FIND_ONLY = """
import importlib.util, json, sys
importlib.util.find_spec("mxnet")
loaded = sorted(m for m in sys.modules if m.split(".")[0] in
                ("numpy", "distutils", "setuptools", "mxnet", "mxoid", "requests")
                or (m.endswith("_at_start_up") and m != "mxoid_compat_at_start_up"))
import requests
plain = type(requests).__name__
import mxnet
hook = next(f for f in sys.meta_path if type(f).__name__ == "_MxoidStartUpHook").hook
started = sorted(hook.find_spec.__globals__["_STARTED"])  # compat's modules loaded by path
print(json.dumps({"loaded": loaded, "requests": plain, "started": started}))
"""


def test_finding_mxnet_without_importing_it_changes_nothing():
    """``importlib.util.find_spec("mxnet")`` (how a parameter-server scheduler finds
    ``libmxnet.so``) is no import: NumPy, distutils, the operator cache stay out, the
    program's own ``import requests`` is a plain one; MXNet imported later still gets all."""
    code, out = python(FIND_ONLY)
    assert code == 0, out
    found = json.loads(out.strip().splitlines()[-1])
    assert found["loaded"] == [], found  # the hook's own compat.py aside: nothing
    assert found["requests"] == "module", found  # not deferred: MXNet was not importing
    assert found["started"] == ["deferred_imports", "distutils_version", "operator_cache"]


# What MXNet 1.9.1 takes from NumPy when it is imported (mxnet/numpy/utils.py), in its order.
IMPORT_TIME_NAMES = ("bool", "PZERO", "NZERO", "NINF", "PINF", "NAN", "NaN")


def test_it_can_be_turned_off():
    # What this NumPy lacks of them, and whether distutils imports, without mxoid's layer.
    probe = (
        "import importlib.util, numpy, warnings; warnings.simplefilter('ignore'); "
        f"print('probe', ([n for n in {IMPORT_TIME_NAMES!r} if not hasattr(numpy, n)], "
        "importlib.util.find_spec('distutils') is not None))"
    )
    code, out = python(probe, MXOID_NO_COMPAT="1")
    assert code == 0, out
    missing, has_distutils = eval(out.split("probe ", 1)[1].splitlines()[0])
    assert NUMPY_2 == ("PZERO" in missing)  # NumPy 2 removed them; NumPy 1.24 removed bool
    code, out = python("import mxnet", MXOID_NO_COMPAT="1")
    if not missing and has_distutils:  # NumPy < 1.24, Python <= 3.11 or setuptools: it imports
        assert code == 0, out
    elif missing:  # MXNet alone fails on the first name it takes that this NumPy lacks
        assert code != 0 and "AttributeError" in out, out
        assert re.search(rf"\bnp\.{missing[0]}\b", out), out
    else:
        assert code != 0 and "distutils" in out, out
    code, out = python("import mxnet; print('imported')")  # and with it, on this NumPy
    assert code == 0 and "imported" in out, out


MXNET_DISTUTILS = """
import sys, warnings
warnings.simplefilter("ignore")
import mxnet.numpy_op_fallback as fallback
print("mxnet", fallback.StrictVersion.__init__.__code__.co_filename)
print("left", sorted(m for m in ("setuptools", "distutils", "distutils.version") if m in sys))
if "mxnet-then-distutils" in sys.argv:
    import distutils.version
    print("own", distutils.version.LooseVersion.__init__.__code__.co_filename)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import setuptools
    print("warned", [str(w.message) for w in caught if "istutils" in str(w.message)])
""".replace("in sys)", "in sys.modules)")
PLAIN_DISTUTILS = """
import importlib.util, warnings
warnings.simplefilter("ignore")
from distutils.version import StrictVersion
print("plain", StrictVersion.__init__.__code__.co_filename)
if importlib.util.find_spec("setuptools"):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import setuptools
    print("warned", [str(w.message) for w in caught if "istutils" in str(w.message)])
"""


def _said(out, word):
    return [line.split(" ", 1)[1] for line in out.splitlines() if line.startswith(word + " ")]


@pytest.mark.parametrize("setting", ["local", "stdlib"])
def test_mxnet_gets_the_distutils_version_it_would_import_and_setuptools_stays_out(setting):
    """MXNet imports ``distutils.version``; where setuptools serves distutils (by default,
    wherever it is installed) that imported setuptools, 0.05-0.1 CPU-s of each ``import
    mxnet``. It gets classes of the same file, loaded alone; afterwards the program's own
    ``import distutils`` is served as without mxoid, and setuptools, imported then, warns
    as it would have. Where no distutils imports (Python 3.12+ without setuptools' shim),
    mxoid's stand-in serves, as before."""
    env = {"SETUPTOOLS_USE_DISTUTILS": setting}
    setuptools_copy = distutils_version.setuptools_version_file()
    code, plain = python(PLAIN_DISTUTILS, **env)
    code, out = python(MXNET_DISTUTILS, **env)
    assert code == 0, out
    (mxnet_file,) = _said(out, "mxnet")
    if _said(plain, "plain"):  # distutils imports here: the same file, and nothing left
        assert [mxnet_file] == _said(plain, "plain"), (out, plain)
        assert _said(out, "left") == ["[]"], out
    else:
        assert mxnet_file in (distutils_version.__file__, setuptools_copy), out
    if _said(plain, "plain") and setuptools_copy:
        code, out = python(MXNET_DISTUTILS + "\n", "mxnet-then-distutils", **env)
        assert code == 0, out
        assert _said(out, "own") == _said(plain, "plain"), (out, plain)
        assert _said(out, "warned") == _said(plain, "warned"), (out, plain)


def test_only_missing_names_are_added():
    fake = types.SimpleNamespace(
        all=np.all,
        any=np.any,
        prod=np.prod,
        round=np.round,
        sort=np.sort,
        isin=np.isin,
        PINF="kept",
    )
    compat._add_missing(fake, compat._numpy_names(np))
    assert fake.PINF == "kept" and fake.NINF == -np.inf and fake.alltrue is np.all
    assert fake.bool is bool and fake.msort(np.array([[2], [1]])).tolist() == [[1], [2]]
    assert fake.in1d(np.array([[1, 5]]), [5]).tolist() == [False, True]
    with pytest.raises(AttributeError, match="numpy-financial"):
        fake.npv(0.1, [1, 2])
    for name in ("PZERO", "NINF", "alltrue", "product", "round_", "bool"):
        assert hasattr(np, name) or name == "bool"  # after import mxoid, on any NumPy


def test_version_comparisons_without_distutils():
    version = distutils_version.version_module()
    assert version.LooseVersion("1.19.5") < "1.23.0" < version.LooseVersion("1.23.10")
    assert version.StrictVersion("2.0.0") >= "1.26.4"


def test_recordio_packs_array_labels_and_round_trips():
    import mxnet as mx

    header = mx.recordio.IRHeader(0, [1.5, 2.5, 3.5], 7, 0)
    record = mx.recordio.pack(header, b"payload")
    unpacked, payload = mx.recordio.unpack(record)
    assert payload == b"payload" and unpacked.flag == 3 and unpacked.id == 7
    assert unpacked.label.tolist() == [1.5, 2.5, 3.5]
    scalar, _ = mx.recordio.unpack(mx.recordio.pack(mx.recordio.IRHeader(0, 4.0, 1, 0), b""))
    assert scalar.label == 4.0 and scalar.flag == 0


def test_entropy_calibration_thresholds_reach_mxnet_as_numbers():
    """MXNet's entropy calibration hands its thresholds to C as floats: arrays of one
    element fail there on NumPy 2 (mxoid.quantize(mode='entropy') would raise)."""
    import ctypes

    import mxnet as mx
    from mxnet.contrib import quantization

    values = np.random.RandomState(0).randn(2000).astype("float32")
    hist, edges = np.histogram(values, bins=8001, range=(-4, 4))
    low, high, threshold, _ = quantization._get_optimal_threshold(
        (hist, edges, values.min(), values.max(), 4.0), "int8"
    )
    assert 0 < float(threshold) <= 4.0
    thresholds = [-threshold, threshold]  # as _get_optimal_thresholds pairs them
    passed = mx.base.c_array(ctypes.c_float, thresholds)  # what _calibrate_quantized_sym does
    assert list(passed) == pytest.approx([-float(threshold), float(threshold)])
    if np.lib.NumpyVersion(np.__version__) >= "1.25.0":
        assert isinstance(threshold, float)  # mxoid.compat's; MXNet's own is an array
