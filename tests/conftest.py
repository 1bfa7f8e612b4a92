"""Shared fixtures: small networks and data made with a fixed seed."""

import json
import os
import subprocess
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MXNET_SUBGRAPH_VERBOSE", "0")

import mxnet as mx  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from mxoid.metrics import native  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
import scheduling  # noqa: E402

TWO_CPUS = [mx.cpu(0), mx.cpu(1)]

# Built ahead of time, as `mxoid native` does (a first loop would build it in the background
# and compute with MXNet's operators meanwhile): tests that compare the fused operator with
# MXNet's need it from their first loop. Where it cannot be built they say so, or skip.
native.build()


LEAN_SITE = os.path.join(os.path.dirname(__file__), "lean_site")
# Not test modules: importing them, as --doctest-modules would, would hide the packages
# here (lean_site) or run the programs the tests start (*/scripts: a training run of 3
# CPU-seconds in each test process, before its first test).
collect_ignore = ["lean_site"]
collect_ignore_glob = ["*/scripts"]


def pytest_configure(config):
    """In the process that runs the tests (an xdist worker, or the only process): the
    processes it starts import MXNet without SciPy and scikit-learn, which mxoid does not
    need and MXNet imports whenever they are installed (0.7 of its 1.8 CPU-seconds: see
    lean_site/sitecustomize.py). ``MXOID_TESTS_HIDDEN=`` (empty) hides nothing."""
    if config.getoption("numprocesses", None) and not hasattr(config, "workerinput"):
        return  # the xdist controller: its workers load the digits with scikit-learn
    os.environ.setdefault("MXOID_TESTS_HIDDEN", "scipy,sklearn")
    path = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join([LEAN_SITE] + path)


def full_environment(**env: str) -> dict:
    """``os.environ`` with nothing hidden from a process (one that uses scikit-learn's
    digits, as the examples do), and these variables."""
    environment = {k: v for k, v in os.environ.items() if k != "MXOID_TESTS_HIDDEN"}
    return {**environment, **env}


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_auto_num_workers(config):
    """``pytest -n auto``: one test process per core and one more. Many tests wait on the
    processes they start (a job's start-up, a launcher's grace period, a stall timeout),
    leaving their core idle; a third process on two cores fills it (the full suite here:
    446 s with two, 420 with three, 429 with four). ``PYTEST_XDIST_AUTO_NUM_WORKERS``
    still decides where set."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None
    return scheduling.cores() + 1


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """Under ``pytest -n`` (xdist's ``load``): the longest tests first, tests sharing a
    module-scoped fixture on one worker (:mod:`scheduling`)."""
    if config.getvalue("dist") == "load":
        return scheduling.scheduler(config, log)
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """In an xdist worker: the longest units first (:mod:`scheduling`), the order in which
    the controller hands them out."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    items[:] = scheduling.longest_first(items)


@pytest.fixture
def job_env(monkeypatch):
    """For the tests of launched jobs (tests/distributed): the marker of this test's
    processes (every one is gone at the end, or the test fails) and their one-thread
    settings (``jobs.job_environment``)."""
    scripts = os.path.join(os.path.dirname(__file__), "distributed", "scripts")
    if scripts not in sys.path:
        sys.path.insert(0, scripts)
    from jobs import job_environment

    with job_environment(monkeypatch) as marker:
        yield marker


def json_from_fresh_python(script: str, **env: str):
    """Run ``script`` in a fresh Python with these environment variables (one OpenMP
    thread); return the JSON object of its last line of output."""
    environment = {**os.environ, "OMP_NUM_THREADS": "1", **env}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=environment, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def mlp(num_hidden: int = 16, num_classes: int = 3) -> mx.sym.Symbol:
    """A two-layer perceptron with a softmax output named 'softmax'."""
    data = mx.sym.Variable("data")
    hidden = mx.sym.Activation(
        mx.sym.FullyConnected(data, num_hidden=num_hidden, name="fc1"),
        act_type="relu",
        name="relu1",
    )
    logits = mx.sym.FullyConnected(hidden, num_hidden=num_classes, name="fc2")
    return mx.sym.SoftmaxOutput(logits, name="softmax")


def two_heads(num_hidden: int = 16, num_classes: int = 3) -> mx.sym.Symbol:
    """A network with a softmax head 'softmax' and a linear-regression head 'reg'."""
    data = mx.sym.Variable("data")
    hidden = mx.sym.Activation(
        mx.sym.FullyConnected(data, num_hidden=num_hidden, name="fc1"), act_type="tanh"
    )
    cls = mx.sym.SoftmaxOutput(
        mx.sym.FullyConnected(hidden, num_hidden=num_classes, name="cls"), name="softmax"
    )
    reg = mx.sym.LinearRegressionOutput(
        mx.sym.FullyConnected(hidden, num_hidden=1, name="regfc"), name="reg"
    )
    return mx.sym.Group([cls, reg])


def classification_data(n: int = 200, dim: int = 10, num_classes: int = 3, seed: int = 0):
    """Separable Gaussian blobs: (X float32 [n, dim], y float32 [n])."""
    rng = np.random.RandomState(seed)
    y = rng.randint(0, num_classes, size=n)
    centers = rng.randn(num_classes, dim) * 2
    X = centers[y] + rng.randn(n, dim)
    return X.astype("float32"), y.astype("float32")


def initial_params(symbol: mx.sym.Symbol, data_shape, label_shapes=None, seed: int = 1):
    """Random initial arg_params for ``symbol`` (host NDArrays), drawn with a fixed seed."""
    rng = np.random.RandomState(seed)
    shapes = {"data": data_shape}
    shapes.update(label_shapes or {})
    arg_shapes, _, _ = symbol.infer_shape(**shapes)
    params = {}
    for name, shape in zip(symbol.list_arguments(), arg_shapes):
        if name not in shapes and not name.endswith("_label"):
            params[name] = mx.nd.array(rng.uniform(-0.3, 0.3, shape))
    return params


@pytest.fixture
def data():
    return classification_data()
