"""mxoid's fused metric operator, compiled from C++ on first use and loaded into MXNet.

The metric head of :class:`~mxoid.TrainingMonitoring` (and of ``Evaluate``)
computes accuracy and cross-entropy per row with about ten MXNet operators per
device and batch; each costs the engine about a microsecond, whatever the
batch. ``metric_rows.cc``, next to this file, computes the same values, bit for
bit, in one operator (``mxoid_metric_rows``), and ``mxoid_metric_sums`` also adds
them to running sums that it keeps, in the training forward pass (TrainingMonitoring's
sums, without the backward pass's operators). MXNet 1.x loads operators from
shared libraries (``mx.library.load``) and its wheel ships the header they are
built against (``mxnet/include/mxnet/lib_api.h``), so mxoid compiles the file
with the machine's C++ compiler the first time a process needs it, keeps the
library in a cache directory, and loads it from there afterwards.

Without a compiler, or when building or loading fails, :func:`available`
returns False, :func:`unavailable_reason` says why, and the metric head uses
MXNet's own operators (the same values; on one CPU, ``benchmarks/head.py``
measured 17-40 us more of the engine's CPU time per batch).

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

import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import threading
import time
from typing import List, Optional, Sequence

import mxnet as mx

from ...executor_manager.devices import one_random_generator

__all__ = [
    "OP_NAME",
    "available",
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

BUILD_TIMEOUT = 300.0
"""Seconds a compilation may take before it is abandoned."""

_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "metric_rows.cc")
_logger = logging.getLogger(__name__)
_lock = threading.Lock()
_state: dict = {}  # "path" once loaded, or "reason" once given up (per process)


def available() -> bool:
    """Return True once the operator is loaded into MXNet (building it if needed).

    Tried once per process; thread-safe. False with ``MXOID_NATIVE=0``, or when
    the library cannot be built or loaded (:func:`unavailable_reason` says why).
    """
    if "path" in _state or "reason" in _state:
        return "path" in _state
    with _lock:
        if "path" not in _state and "reason" not in _state:
            try:
                _state["path"] = _load()
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
      (``benchmarks/head.py``, batch 128 on two CPU contexts: the fused head cost
      42 us a batch, MXNet's operators 22).
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
    return _state.get("reason")


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
    return getattr(mx.sym, OP_NAME)(pred, label, columns=",".join(columns))


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
    return getattr(mx.sym, SUMS_OP_NAME)(pred, label, counting, sums, columns=",".join(columns))


def _check_columns(columns: Sequence[str]) -> None:
    unknown = [c for c in columns if c not in COLUMNS]
    if unknown or not columns:
        raise ValueError(f"columns must be names from {COLUMNS}, got {list(columns)}")


class _Unavailable(Exception):
    pass


def _load() -> str:
    if os.environ.get("MXOID_NATIVE", "1").strip() == "0":
        raise _Unavailable("MXOID_NATIVE=0")
    path = _build()
    try:
        mx.library.load(path, verbose=False)
    except Exception as error:  # a library MXNet refuses: say so, compute without it
        first = str(error).strip().splitlines()[:1]
        raise _Unavailable(
            f"MXNet could not load {path} (delete it to build it again): {' '.join(first)}"
        ) from None
    for name in (OP_NAME, SUMS_OP_NAME):
        if not hasattr(mx.sym, name):
            raise _Unavailable(f"{path} loaded, but MXNet has no operator {name}")
    return path


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
    given = os.environ.get("MXOID_CACHE_DIR")
    if given:
        return given
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "mxoid")


def _build() -> str:
    """Return the path of the library for this source, MXNet and compiler, building it once."""
    package = os.path.dirname(os.path.abspath(mx.__file__))
    include = os.path.join(package, "include")
    lib_api = os.path.join(package, "src", "lib_api.cc")
    header = os.path.join(include, "mxnet", "lib_api.h")
    if not (os.path.isfile(lib_api) and os.path.isfile(header)):
        raise _Unavailable(f"this MXNet ships no lib_api.h / lib_api.cc (looked in {package})")
    flags = ["-O2", "-std=c++11", "-shared", "-fPIC"]
    digest = hashlib.sha256()  # what the library is built from (any compiler builds the same)
    for name in (_SOURCE, header, lib_api):
        with open(name, "rb") as f:
            digest.update(f.read())
    digest.update(" ".join([mx.__version__, *flags]).encode())
    directory = _cache_dir()
    target = os.path.join(directory, f"libmxoid_metric_rows-{digest.hexdigest()[:16]}.so")
    if os.path.isfile(target):
        return target
    compiler = _compiler()
    try:
        os.makedirs(directory, exist_ok=True)
        _remove_abandoned(directory)
        # Built under a name of its own, then renamed: processes that build at the same
        # time each rename a whole library, and none loads a half-written one.
        handle, partial = tempfile.mkstemp(suffix=".so", prefix=".building-", dir=directory)
        os.close(handle)
    except OSError as error:
        raise _Unavailable(f"cannot write to the cache directory {directory}: {error}") from None
    command = [*compiler, *flags, "-I", include, _SOURCE, lib_api, "-o", partial]
    _logger.info("building mxoid's fused metric operator (once) into %s", target)
    try:
        try:
            done = subprocess.run(
                command, capture_output=True, text=True, timeout=BUILD_TIMEOUT, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as error:
            raise _Unavailable(f"{' '.join(compiler)} failed to run: {error}") from None
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            raise _Unavailable(
                f"{' '.join(compiler)} failed (status {done.returncode}): {' / '.join(tail)}"
            )
        os.replace(partial, target)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    return target


def _remove_abandoned(directory: str) -> None:
    """Remove partial libraries of builds that were killed (older than two build timeouts)."""
    now = time.time()
    for name in os.listdir(directory):
        if name.startswith(".building-"):
            path = os.path.join(directory, name)
            try:
                if now - os.path.getmtime(path) > 2 * BUILD_TIMEOUT:
                    os.unlink(path)
            except OSError:  # another process removed or renamed it
                pass
