"""Hide the packages named in ``MXOID_TESTS_HIDDEN`` from the processes the tests start.

``import mxnet`` imports scikit-learn (``mxnet.model``) and SciPy (``mxnet.ndarray.sparse``,
``mxnet.contrib.quantization``) whenever they are installed: 0.7 of its 1.8 seconds of CPU.
mxoid needs neither (its dependencies are MXNet, NumPy and tqdm); the test environment has
them for scikit-learn's digits, which the test processes themselves load. The tests put
this folder on ``PYTHONPATH`` with ``MXOID_TESTS_HIDDEN=scipy,sklearn`` for the workers,
servers and scripts they start (tests/conftest.py), so each starts as it would where only
mxoid's dependencies are installed; the examples, which use the digits, run with nothing
hidden. An import of a hidden package raises ``ModuleNotFoundError``, as where it is not
installed.

Python runs the first ``sitecustomize`` on ``sys.path``: this one runs the one it shadows,
if there is one, past any other lean site (a test that runs pytest in a clone of the
repository puts the clone's before this one).
"""

import os
import sys


class HiddenPackages:
    """A meta path finder for which the named top-level packages are not installed."""

    mxoid_lean_site = True  # how a second lean site (a clone's tests) knows one is there

    def __init__(self, names):
        self.names = frozenset(names)

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in self.names:
            raise ModuleNotFoundError(
                f"No module named {name!r} (hidden by MXOID_TESTS_HIDDEN)", name=name
            )
        return None


def _is_lean_site(path):
    try:
        with open(path, encoding="utf-8") as file:
            return "mxoid_lean_site = True" in file.read()
    except OSError:
        return False


def _run_shadowed():
    """Run the first ``sitecustomize`` on ``sys.path`` that is not a lean site (this one, or
    another checkout's, as where the tests run pytest in a clone of the repository)."""
    import importlib.machinery
    import importlib.util

    path = list(sys.path)
    while True:
        spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
        if spec is None or spec.origin is None or spec.loader is None:
            return
        if not _is_lean_site(spec.origin):
            break
        folder = os.path.dirname(os.path.abspath(spec.origin))
        path = [p for p in path if os.path.abspath(p or os.curdir) != folder]
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


_hidden = [name for name in os.environ.get("MXOID_TESTS_HIDDEN", "").split(",") if name]
if _hidden and not any(getattr(f, "mxoid_lean_site", False) for f in sys.meta_path):
    sys.meta_path.insert(0, HiddenPackages(_hidden))
_run_shadowed()
