"""mxoid's fused metric operator, compiled from C++ on first use and loaded into MXNet.

The metric head of :class:`~mxoid.TrainingMonitoring` (and of ``Evaluate``)
computes accuracy and cross-entropy per row with about ten MXNet operators per
device and batch; each costs the engine about a microsecond, whatever the
batch. ``metric_rows.cc``, next to this file, computes the same values, bit for
bit, in one operator (``mxoid_metric_rows``), and ``mxoid_metric_sums`` also adds
them to running sums that it keeps, in the training forward pass (TrainingMonitoring's
sums, without the backward pass's operators). MXNet 1.x loads operators from
shared libraries and its wheel ships the header they are built against
(``mxnet/include/mxnet/lib_api.h``), so mxoid compiles the file with the machine's
C++ compiler once, keeps the library in a cache directory, and loads it from there
(a few milliseconds). The first loop on a machine does not wait for the compiler:
it starts the build in the background, says so in one log line, and trains with
MXNet's operators; ``mxoid native`` (:func:`build`) builds it ahead of time. The
background build never outlives the process that started it by more than a second:
a script that ends first stops it (the compiler, its partial file and its claim
with it), and a later loop starts it again; a script that trains longer than the
build (about 20 s of a compiler) uses the operator from its next loop on, and every
later process from its first.

Without a compiler, or when building or loading fails, :func:`available`
returns False, :func:`unavailable_reason` says why, and the metric head uses
MXNet's own operators (the same values; on one CPU, the head suite, ``python
benchmarks/run.py head``, measured 17-40 us more of the engine's CPU time per batch).

Environment:

``MXOID_NATIVE=0``
    Never build or load the operator.
``MXOID_CACHE_DIR``
    Where the library is kept (default ``$XDG_CACHE_HOME/mxoid`` or
    ``~/.cache/mxoid``); one file per version of the source and of MXNet.
``CXX``
    The C++ compiler (default ``c++``, then ``g++``), needed only to build.
"""

from __future__ import annotations

import atexit
import ctypes
import hashlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from typing import List, Optional, Sequence

import mxnet as mx
from mxnet._ctypes.symbol import _symbol_creator
from mxnet.attribute import AttrScope
from mxnet.base import _LIB, OpHandle, c_str, check_call, mx_uint
from mxnet.name import NameManager

from ...executor_manager.devices import one_random_generator
from ...operator_cache import cache_dir
from . import builder

__all__ = [
    "OP_NAME",
    "available",
    "build",
    "library_path",
    "metric_rows",
    "metric_sums",
    "SUMS_OP_NAME",
    "suits",
    "unavailable_reason",
]

OP_NAME = "mxoid_metric_rows"
"""The operator's name in MXNet, once loaded."""

SUMS_OP_NAME = "mxoid_metric_sums"
"""The name of the operator that also adds the values to running sums."""

COLUMNS = ("accuracy", "cross_entropy")
"""The values the operator computes, by the names of mxoid's metrics."""

_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "metric_rows.cc")
_BUILDER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "builder.py")
_logger = logging.getLogger(__name__)
_lock = threading.Lock()
_state: dict = {}  # "path" once loaded, or "reason" once given up (per process)


def available() -> bool:
    """Return True once the operator is loaded into MXNet; never waits for a compiler.

    Thread-safe. Loads the library when the cache holds it (a few milliseconds). When
    it does not, starts building it in a process of its own, says so in one log line
    (a warning: once per machine, a few seconds of a compiler) and returns False:
    this loop's metric heads use MXNet's operators, and loops made once the build
    is done (in this process or a later one) use the operator. False for good with
    ``MXOID_NATIVE=0``, or when the library cannot be built or loaded
    (:func:`unavailable_reason` says why). :func:`build` waits for the build instead.
    """
    return _available(wait=False)


def build() -> bool:
    """Build the library if the cache lacks it (or wait for the process building it).

    Then load it and return :func:`available`. ``mxoid native`` runs this ahead of time.
    """
    return _available(wait=True)


def _available(wait: bool) -> bool:
    if "path" in _state or "reason" in _state:
        return "path" in _state
    with _lock:
        if "path" not in _state and "reason" not in _state:
            try:
                path = _library(wait)
                if path is not None:
                    _state["path"] = _load(path)
            except _Unavailable as error:
                _state["reason"] = str(error)
                _logger.info(
                    "mxoid's fused metric operator is unavailable (%s); metric heads "
                    "use MXNet's operators instead (the same values, more operators)",
                    error,
                )
    return "path" in _state


def suits(contexts: Optional[Sequence[mx.Context]] = None) -> bool:
    """Return True where the operator may serve executors on ``contexts`` (None: one CPU).

    One CPU context, where MXNet keeps one parallel random generator for the CPU
    (``MXNET_CPU_PARALLEL_RAND_COPY`` unset or 1, as MXNet read it when it
    started). The operator has no GPU code. And MXNet gives every operator
    loaded from a library a parallel random generator (this one draws nothing
    from it):

    - With MXNet's one generator, which all CPU operators share, that changes
      nothing for the network's own random operators. But executors on several
      CPU contexts would wait for each other's forward passes
      (the head suite, ``python benchmarks/run.py head``, batch 128 on two CPU
      contexts: the fused head cost 42 us a batch, MXNet's operators 22).
    - With several copies MXNet hands them out in turn as executors are bound,
      so the operator would take the copy that a ``Dropout`` bound after it gets
      without it: the next device's executor, or the next loop's before
      ``mx.random.seed``. Adding TrainingMonitoring would change the masks, and
      the training (tested: two CPUs, two copies, a network with Dropout).
    """
    contexts = list(contexts or [mx.cpu()])
    return len(contexts) == 1 and one_random_generator(contexts)


def unavailable_reason() -> Optional[str]:
    """Return why the operator is not loaded (None when it is, or has not been tried)."""
    if "path" in _state:
        return None
    return _state.get("reason") or _state.get("building")


def library_path() -> Optional[str]:
    """Return the loaded library's path (None when it is not loaded)."""
    return _state.get("path")


def metric_rows(pred: mx.sym.Symbol, label: mx.sym.Symbol, columns: Sequence[str]) -> mx.sym.Symbol:
    """Return the operator on ``pred`` (float32, rows x classes) and ``label`` (float32, rows).

    Returns a float64 symbol of shape ``(rows, len(columns))``: for each name
    in ``columns`` (from :data:`COLUMNS`), the per-row values of that metric.
    Call only when :func:`available` is True.
    """
    _check_columns(columns)
    return _symbol(OP_NAME, [pred, label], columns=",".join(columns))


def metric_sums(
    pred: mx.sym.Symbol,
    label: mx.sym.Symbol,
    columns: Sequence[str],
    counting: mx.sym.Symbol,
    sums: mx.sym.Symbol,
) -> mx.sym.Symbol:
    """Return :func:`metric_rows`'s values, also added to ``sums`` while ``counting`` says so.

    ``sums`` (float64, shaped like the values) is an input the operator writes,
    so MXNet binds it as an auxiliary state of the executor; ``counting`` is a
    float64 argument of shape ``(1,)``: each forward pass adds the values to
    ``sums`` when it is not 0. Call only when :func:`available` is True.
    """
    _check_columns(columns)
    return _symbol(SUMS_OP_NAME, [pred, label, counting, sums], columns=",".join(columns))


def _check_columns(columns: Sequence[str]) -> None:
    unknown = [c for c in columns if c not in COLUMNS]
    if unknown or not columns:
        raise ValueError(f"columns must be names from {COLUMNS}, got {list(columns)}")


class _Unavailable(Exception):
    pass


def _load(path: str) -> str:
    try:
        _load_library(path)
    except Exception as error:  # a library MXNet refuses: say so, compute without it
        first = str(error).strip().splitlines()[:1]
        raise _Unavailable(
            f"MXNet could not load {path} (delete it to build it again): {' '.join(first)}"
        ) from None
    return path


def _load_library(path: str) -> None:
    """Load the library into MXNet and keep the handles of its two operators.

    ``mx.library.load`` also makes Python functions again for every operator MXNet
    has (about 950: 1-2 s of a loop's start-up); mxoid needs none of them, and
    makes its two symbols itself (:func:`_symbol`).
    """
    check_call(_LIB.MXLoadLib(ctypes.c_char_p(path.encode("utf-8")), mx_uint(0)))
    for name in (OP_NAME, SUMS_OP_NAME):
        handle = OpHandle()
        check_call(_LIB.NNGetOpHandle(c_str(name), ctypes.byref(handle)))
        _handles[name] = handle.value  # an address, as MXNet's generated functions pass it


def _symbol(name: str, inputs: Sequence[mx.sym.Symbol], **params: str) -> mx.sym.Symbol:
    """Return the operator ``name`` on ``inputs``, named as MXNet's generated functions do.

    The current ``NameManager`` names it, the current ``AttrScope`` gives its attributes.
    """
    if not hasattr(AttrScope._current, "value"):
        AttrScope._current.value = AttrScope()
    params.update(AttrScope._current.value.get(None))
    if not hasattr(NameManager._current, "value"):
        NameManager._current.value = NameManager()
    symbol_name = NameManager._current.value.get(None, name)
    keys = list(params)
    return _symbol_creator(
        _handles[name], list(inputs), {}, keys, [params[k] for k in keys], symbol_name, False
    )


_handles: dict = {}


def _compiler() -> List[str]:
    given = os.environ.get("CXX")
    if given:
        return given.split()
    for name in ("c++", "g++"):
        found = shutil.which(name)
        if found:
            return [found]
    raise _Unavailable("no C++ compiler found (install g++, or set CXX)")


def _cache_dir() -> str:
    return cache_dir()  # shared with MXNet's compiled operator functions


def _library(wait: bool) -> Optional[str]:
    """Return the library's path in the cache, building it if need be.

    None while it is being built (``wait`` False). Raises :class:`_Unavailable` when
    it cannot be had.
    """
    if os.environ.get("MXOID_NATIVE", "1").strip() == "0":
        raise _Unavailable("MXOID_NATIVE=0")
    request = _request()
    target = request["target"]
    if os.path.isfile(target):
        return target
    compiler = _compiler()
    request["compiler"] = compiler
    deadline = time.monotonic() + 2 * builder.BUILD_TIMEOUT
    while True:
        if os.path.isfile(target):
            return target
        failed = builder.failure(target, compiler)
        if failed is not None:
            raise _Unavailable(f"{failed} (remove {target}.failed to try again)")
        if builder.claim(target):
            if not wait:
                _build_in_background(request)
                return None
            try:
                builder.build(request)
            except builder.BuildError as error:
                raise _Unavailable(str(error)) from None
            return target
        if not wait:
            _state.setdefault("building", f"another process is building {target}")
            return None
        if time.monotonic() > deadline:
            raise _Unavailable(f"the process building {target} has not finished")
        time.sleep(0.1)


def _request() -> dict:
    """Return where the library for this source and MXNet goes, and what it is built from."""
    package = os.path.dirname(os.path.abspath(mx.__file__))
    include = os.path.join(package, "include")
    lib_api = os.path.join(package, "src", "lib_api.cc")
    header = os.path.join(include, "mxnet", "lib_api.h")
    if not (os.path.isfile(lib_api) and os.path.isfile(header)):
        raise _Unavailable(f"this MXNet ships no lib_api.h / lib_api.cc (looked in {package})")
    digest = hashlib.sha256()  # what the library is built from (any compiler builds the same)
    for name in (_SOURCE, header, lib_api):
        with open(name, "rb") as f:
            digest.update(f.read())
    digest.update(" ".join([mx.__version__, *builder.FLAGS]).encode())
    directory = _cache_dir()
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as error:
        raise _Unavailable(f"cannot write to the cache directory {directory}: {error}") from None
    target = os.path.join(directory, f"libmxoid_metric_rows-{digest.hexdigest()[:16]}.so")
    return {"target": target, "include": include, "sources": [_SOURCE, lib_api]}


def _build_in_background(request: dict) -> None:
    """Start the build in a process of its own (it outlives this one) and say so."""
    try:
        process = subprocess.Popen(
            [sys.executable, _BUILDER, json.dumps(request)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C meant for the training does not stop it
        )
    except OSError as error:
        os.unlink(request["target"] + ".building")
        raise _Unavailable(f"cannot start the build: {error}") from None
    if not _background:
        atexit.register(_stop_background_builds)
    _background.append(process)
    _state["building"] = f"it is being built into {request['target']} (process {process.pid})"
    _state["building_target"] = request["target"]
    _logger.warning(
        "mxoid: building its fused metric operator into %s in the background (once per "
        "machine, a few seconds; stopped if this script ends first); until then metric "
        "heads use MXNet's operators (the same values). 'mxoid native' builds it ahead "
        "of time.",
        request["target"],
    )


_background: List[subprocess.Popen] = []  # kept so that Python does not warn it still runs
STOP_WAIT_S = 0.8
"""How long a background build stopped at exit may take to unwind before it is killed."""


def _stop_background_builds() -> None:
    """At exit: stop the builds this process started that are still running.

    SIGTERM first (the builder removes its partial file and its claim), then, after at
    most :data:`STOP_WAIT_S`, SIGKILL to what is left of its process group (the
    compiler's own processes); a claim left behind is removed, so that the next process
    builds at once.
    """
    for process in _background:
        if process.poll() is not None:
            continue
        process.terminate()
        try:
            process.wait(STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            pass
        try:  # its own session: the compiler and the compiler's own processes too
            os.killpg(process.pid, signal.SIGKILL)
        except OSError:  # none left
            pass
        process.wait()
    target = _state.get("building_target")
    if target and not os.path.isfile(target):
        try:
            os.unlink(target + ".building")
        except OSError:
            pass
