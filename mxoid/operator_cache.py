"""MXNet's operator functions compiled once per machine: ``import mxnet`` in half the CPU time.

``import mxnet`` writes the Python source of a function for every operator of its
library (``mx.nd.FullyConnected``, ``mx.sym.Convolution``, ``mx.nd.np.add``...: about
2,560 of them, with their documentation) and compiles each with ``exec``, every time a
process starts: half of the import's CPU time. The start-up hook of :mod:`mxoid.compat`
(the ``mxoid-mxnet-compat.pth`` file of an install, or ``import mxoid`` before MXNet)
gives MXNet's two generator modules, ``mxnet.ndarray.register`` and
``mxnet.symbol.register``, an ``exec`` that takes the compiled code from a file when
it has it; MXNet still writes every source and sets every name and docstring itself.

How it stays exact
------------------
- Each source is found by its text, its operator's handle aside: the handle (the
  operator's address in ``libmxnet``, the only part that changes from one process to
  the next) is replaced by a stand-in of as many digits (all nines: the columns of
  the code's position table stay the same) before the text is hashed and compiled
  (with the ``__future__`` flags of MXNet's caller, as ``exec`` compiles), and the
  cached code gets the process's handle back in its constants. So the function is the
  one ``exec`` would have made of the same text (tested: ``__code__``, name and
  docstring equal for every operator), and a source that a new MXNet writes
  differently is compiled anew.
- A source with no handle, or more than one, or with its stand-in's digits anywhere,
  is compiled as MXNet would (not cached).
- One file per Python bytecode version (``mxnet-operators.cpython-311.marshal``...),
  starting with that Python's magic number; a file that cannot be read as one is
  ignored and replaced. A process writes it (a temporary file renamed over it, so a
  reader sees a whole file or the previous one) only when it compiled something, with
  exactly what its own import used.

Where: ``$MXOID_CACHE_DIR``, else ``$XDG_CACHE_HOME/mxoid``, else ``~/.cache/mxoid``
(the folder of the native metric library, :mod:`mxoid.metrics.native`), about 6 MB.
A folder that cannot be written only means no cache. ``MXOID_OPERATOR_CACHE=0`` turns
it off (so does ``MXOID_NO_COMPAT``, which turns off the whole start-up hook).

This module imports nothing outside the standard library: the start-up hook loads it
by its path, before MXNet or mxoid are imported.
"""

from __future__ import annotations
import __future__

import builtins
import functools
import hashlib
import importlib.util
import marshal
import operator
import os
import sys
import time
import types
from typing import Any, Dict, Optional

__all__ = ["DISABLE", "MODULES", "OperatorCache", "cache_dir", "cache_file", "enabled"]

DISABLE = "MXOID_OPERATOR_CACHE"
"""Set to ``0`` to compile MXNet's operator functions at every import, as MXNet does."""

MODULES = ("mxnet.ndarray.register", "mxnet.symbol.register")
"""The MXNet modules whose ``exec`` calls the cache serves."""

HEADER = importlib.util.MAGIC_NUMBER + b" mxoid operator functions 1\n"
_CALLS = ("_imperative_invoke(", "_symbol_creator(")  # the call that names the handle
STALE_SECONDS = 3600
"""A temporary file this old is the remains of a killed save: the next save removes it."""
_FUTURE = functools.reduce(
    operator.or_, (getattr(__future__, name).compiler_flag for name in __future__.all_feature_names)
)


def cache_dir() -> str:
    """``$MXOID_CACHE_DIR``, else ``$XDG_CACHE_HOME/mxoid``, else ``~/.cache/mxoid``."""
    given = os.environ.get("MXOID_CACHE_DIR")
    if given:
        return given
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "mxoid")


def cache_file() -> str:
    """Return this Python's file of compiled operator functions in :func:`cache_dir`."""
    return os.path.join(cache_dir(), f"mxnet-operators.{sys.implementation.cache_tag}.marshal")


def enabled() -> bool:
    """Tell whether the cache is on: False where ``MXOID_OPERATOR_CACHE=0``."""
    return os.environ.get(DISABLE, "1").strip() != "0"


def _read(path: str) -> Dict[bytes, types.CodeType]:
    try:
        with open(path, "rb") as file:
            data = file.read()
    except OSError:
        return {}
    if not data.startswith(HEADER):
        return {}
    try:
        codes = marshal.loads(memoryview(data)[len(HEADER) :])
    except (EOFError, ValueError, TypeError):
        return {}
    if not isinstance(codes, dict):
        return {}
    return {k: v for k, v in codes.items() if isinstance(v, types.CodeType)}


def _with_handle(code: types.CodeType, stand_in: int, handle: int) -> types.CodeType:
    consts = tuple(
        _with_handle(c, stand_in, handle)
        if isinstance(c, types.CodeType)
        else (handle if type(c) is int and c == stand_in else c)
        for c in code.co_consts
    )
    return code.replace(co_consts=consts)


def _remove_stale(folder: str, name: str) -> None:
    """Remove the temporary files of saves that were killed (an hour old or more)."""
    for entry in os.scandir(folder):
        if entry.name.startswith(name + ".") and entry.name.endswith(".tmp"):
            try:
                if entry.stat().st_mtime < time.time() - STALE_SECONDS:
                    os.unlink(entry.path)
            except OSError:
                pass


class OperatorCache:
    """The compiled operator functions of one ``import mxnet``: :meth:`exec`, then :meth:`save`.

    Parameters
    ----------
    path : str, optional
        The file (default :func:`cache_file`).
    """

    modules = MODULES

    def __init__(self, path: Optional[str] = None) -> None:
        self.path = path or cache_file()
        self.known = _read(self.path)
        self.used: Dict[bytes, types.CodeType] = {}
        self.compiled = 0

    def code(self, source: str, flags: int = 0) -> Optional[types.CodeType]:
        """Return the compiled code of one of MXNet's operator sources; None for any other text.

        ``flags``: the ``__future__`` compiler flags of the code calling ``exec``.
        """
        if sum(source.count(call) for call in _CALLS) != 1:
            return None
        call = next(call for call in _CALLS if call in source)
        start = source.find(call) + len(call)
        end = source.find(",", start)
        handle = source[start:end]
        if not (0 < len(handle) < 40 and handle.isdigit() and handle.isascii()):
            return None
        stand_in = "9" * len(handle)
        if stand_in in source:
            return None
        generic = source[:start] + stand_in + source[end:]
        key = hashlib.blake2b(b"%d\n%s" % (flags, generic.encode()), digest_size=16).digest()
        code = self.used.get(key) or self.known.get(key)
        if code is None:
            code = compile(generic, "<string>", "exec", flags=flags, dont_inherit=True)
            self.compiled += 1
        self.used[key] = code
        return _with_handle(code, int(stand_in), int(handle))

    def exec(self, source: Any, globals: Any = None, locals: Any = None) -> None:  # noqa: A002
        """``exec`` as MXNet calls it (``exec(code, None, local)``), from the cache."""
        caller = sys._getframe(1)
        if globals is None:
            globals = caller.f_globals  # noqa: A001
            if locals is None:
                locals = caller.f_locals  # noqa: A001
        if isinstance(source, str):
            source = self.code(source, caller.f_code.co_flags & _FUTURE) or source
        builtins.exec(source, globals, locals)

    def save(self) -> bool:
        """Write what this import used if it compiled anything; False where it cannot."""
        used, self.known, self.used = self.used, {}, {}  # the import is over: free them
        if not self.compiled or not used:
            return True
        folder = os.path.dirname(self.path)
        temporary = f"{self.path}.{os.urandom(6).hex()}.tmp"
        try:
            os.makedirs(folder, exist_ok=True)
            _remove_stale(folder, os.path.basename(self.path))
            with open(temporary, "xb") as file:
                file.write(HEADER)
                marshal.dump(used, file)
            os.replace(temporary, self.path)
        except OSError:
            try:
                os.unlink(temporary)
            except OSError:
                pass
            return False
        return True
