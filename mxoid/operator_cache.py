"""MXNet's operator functions written and compiled once per machine: ``import mxnet`` faster.

``import mxnet`` writes the Python source of a function for every operator of its
library (``mx.nd.FullyConnected``, ``mx.sym.Convolution``, ``mx.nd.np.add``...: about
2,560 of them, with their documentation) and compiles each with ``exec``, every time a
process starts: half of the import's CPU time. The start-up hook of :mod:`mxoid.compat`
(the ``mxoid-mxnet-compat.pth`` file of an install, or ``import mxoid`` before MXNet)
gives MXNet's two generator modules, ``mxnet.ndarray.register`` and
``mxnet.symbol.register``, an ``exec`` that takes the compiled code from a file when
it has it. Writing the sources is another tenth of the import: while MXNet's
``_init_op_module`` and ``_init_np_op_module`` run (made :meth:`OperatorCache.initializer`'s
for the import, and given back after it), MXNet's two source writers are served from
the same file too, for the library and files the sources were written from
(:func:`identity`); MXNet still makes every function, and sets its name and docstring.

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
- A source (and the docstring written with it) is served only where the file's sources
  were written for the same :func:`identity`: the path, size and modification time of
  ``libmxnet.so`` and of the Python files that write the sources, Python's version and
  the line separator; another MXNet, a changed file or a damaged entry, and MXNet
  writes it (tested: the same functions, and the file written anew). The sources of
  :data:`OTHER_INSTALLS` other installs (other virtual environments) are kept too. The handle of
  the operator in this process goes into the served text, as into the code.
- One file per Python bytecode version (``mxnet-operators-2.cpython-311.marshal``...),
  starting with that Python's magic number; a file that cannot be read as one is
  ignored and replaced. An import maps the file and reads the codes and its own
  install's sources, not the other installs' (:mod:`mxoid.operator_file`). A process writes it
  (a temporary file renamed over it, so a reader sees a whole file or the previous
  one) only when it compiled or wrote something, with exactly what its own import
  used; it then removes the file of the earlier layout (``mxnet-operators.cpython-311
  .marshal``, read whole by every import), if any.

Where: ``$MXOID_CACHE_DIR``, else ``$XDG_CACHE_HOME/mxoid``, else ``~/.cache/mxoid``
(the folder of the native metric library, :mod:`mxoid.metrics.native`), about 12 MB.
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
import operator
import os
import sys
import types
from typing import Any, Dict, Optional

__all__ = ["DISABLE", "MODULES", "OperatorCache", "cache_dir", "cache_file", "enabled"]

DISABLE = "MXOID_OPERATOR_CACHE"
"""Set to ``0`` to compile MXNet's operator functions at every import, as MXNet does."""

MODULES = ("mxnet.ndarray.register", "mxnet.symbol.register")
"""The MXNet modules whose ``exec`` calls the cache serves."""

_CALLS = ("_imperative_invoke(", "_symbol_creator(")  # the call that names the handle
_GENERATORS = ("_generate_ndarray_function_code", "_generate_symbol_function_code")
_GENERATOR_FILES = (
    "base.py",
    "ndarray/register.py",
    "symbol/register.py",
    "ndarray_doc.py",
    "symbol_doc.py",
    "libinfo.py",
)
_INITIALIZERS = ("_init_op_module", "_init_np_op_module")  # mxnet.base's, making them
OTHER_INSTALLS = 2
"""Sources kept for other MXNet installs sharing the file (other virtual environments of
the same Python), besides this one's, so that they do not write it in turns."""
try:
    from . import operator_file as _file
except ImportError:  # loaded by its path at start-up (mxoid.compat): so is its sibling
    _spec = importlib.util.spec_from_file_location(
        "mxoid_operator_file_at_start_up",
        os.path.join(os.path.dirname(os.path.abspath(__file__)), "operator_file.py"),
    )
    _file = importlib.util.module_from_spec(_spec)  # type: ignore[arg-type]
    _spec.loader.exec_module(_file)  # type: ignore[union-attr]
HEADER = _file.HEADER
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
    return os.path.join(cache_dir(), f"mxnet-operators-2.{sys.implementation.cache_tag}.marshal")


def enabled() -> bool:
    """Tell whether the cache is on: False where ``MXOID_OPERATOR_CACHE=0``."""
    return os.environ.get(DISABLE, "1").strip() != "0"


def identity(base: Any) -> Optional[str]:
    """Say what MXNet's operator sources are made from.

    Its library and the files that write them (path, size, modification time), Python's
    version, the line separator. ``base``: ``mxnet.base``, loaded. None where one of them
    cannot be found.
    """
    folder = os.path.dirname(os.path.abspath(base.__file__))
    paths = [getattr(getattr(base, "_LIB", None), "_name", None)]
    paths += [os.path.join(folder, *part.split("/")) for part in _GENERATOR_FILES]
    parts = [sys.version, repr(os.linesep)]
    try:
        for path in paths:
            status = os.stat(path)
            parts.append(f"{path}:{status.st_size}:{status.st_mtime_ns}")
    except (OSError, TypeError, ValueError):
        return None
    return "\n".join(parts)


def _with_handle(code: types.CodeType, stand_in: int, handle: int) -> types.CodeType:
    """``code`` with the integer constant ``stand_in`` (in it or its nested codes) replaced."""
    consts = code.co_consts
    changed = None
    for index, const in enumerate(consts):
        kind = type(const)
        if kind is int and const == stand_in:
            changed = changed or list(consts)
            changed[index] = handle
        elif kind is types.CodeType:
            nested = _with_handle(const, stand_in, handle)
            if nested is not const:
                changed = changed or list(consts)
                changed[index] = nested
    return code if changed is None else code.replace(co_consts=tuple(changed))


def _remove_former(path: str) -> None:
    """Remove the file of the earlier layout beside ``path`` (mxoid 0.5's), if any."""
    former = os.path.join(
        os.path.dirname(path), f"mxnet-operators.{sys.implementation.cache_tag}.marshal"
    )
    if path == cache_file() and os.path.exists(former):
        try:
            os.unlink(former)
        except OSError:
            pass


class _Source(str):
    """An operator source served from the file, with the code it compiles to."""

    code: types.CodeType
    flags: int


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
        self.file: Optional[Any] = _file.CacheFile(self.path)  # this install's sources: once known
        self.known = self.file.codes()
        self.used: Dict[bytes, types.CodeType] = {}
        self.compiled = 0
        self.identity: Optional[str] = None
        self.sources: Dict[Any, Any] = {}  # (module, operator, function name) -> entry
        self.noted: Dict[Any, Any] = {}  # the entries this import used
        self.generated = 0  # sources MXNet wrote (not served from the file)
        self.pending: Any = None  # the last source MXNet wrote, until exec compiles it

    def _parse(self, source: str, flags: int) -> Optional[tuple]:
        """Return (generic text, handle's start, its digits, key) of a source; or None."""
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
        return generic, start, handle, key

    def code(self, source: str, flags: int = 0) -> Optional[types.CodeType]:
        """Return the compiled code of one of MXNet's operator sources; None for any other text.

        ``flags``: the ``__future__`` compiler flags of the code calling ``exec``.
        """
        parsed = self._parse(source, flags)
        if parsed is None:
            return None
        generic, start, handle, key = parsed
        code = self.used.get(key) or self.known.get(key)
        if code is None:
            code = compile(generic, "<string>", "exec", flags=flags, dont_inherit=True)
            self.compiled += 1
        self.used[key] = code
        pending, self.pending = self.pending, None
        if pending is not None and pending[0] is source:  # MXNet wrote it: note it
            self.noted[pending[1]] = (generic, start, len(handle), pending[2], flags, key)
            self.generated += 1
        return _with_handle(code, int("9" * len(handle)), int(handle))

    def exec(self, source: Any, globals: Any = None, locals: Any = None) -> None:  # noqa: A002
        """``exec`` as MXNet calls it (``exec(code, None, local)``), from the cache."""
        caller = sys._getframe(1)
        if globals is None:
            globals = caller.f_globals  # noqa: A001
            if locals is None:
                locals = caller.f_locals  # noqa: A001
        flags = caller.f_code.co_flags & _FUTURE
        if type(source) is _Source and source.flags == flags:
            source = source.code
        elif isinstance(source, str):
            source = self.code(str(source), flags) or source
        builtins.exec(source, globals, locals)

    def serve_sources(self, identity: Optional[str]) -> None:
        """Serve MXNet's sources from the file where it was written for ``identity``.

        See :func:`identity`; the sources are noted for the next file. None: neither.
        """
        file, self.file = self.file, None
        self.identity = identity
        if file is not None:
            self.sources = file.sources(identity)
            file.close()

    def _serve(self, name: tuple, handle: Any) -> Optional[tuple]:
        entry = self.sources.get(name)
        if entry is None:
            return None
        try:
            generic, start, length, doc, flags, key = entry
            digits = str(int(handle.value))
            code = self.used.get(key) or self.known.get(key)
            if code is None or len(digits) != length or not isinstance(doc, (str, type(None))):
                return None
            source = _Source(generic[:start] + digits + generic[start + length :])
            source.code = _with_handle(code, int("9" * length), int(digits))
            source.flags = int(flags)
        except (TypeError, ValueError, AttributeError):  # an entry the file damaged
            return None
        self.used[key] = code
        self.noted[name] = entry
        return source, doc

    def generator(self, original: Any, module: str) -> Any:
        """Return MXNet's source writer ``original`` (of the module ``module``), served.

        It serves what :meth:`serve_sources` gave, and notes what it writes.
        """

        @functools.wraps(original)
        def generate(handle: Any, op_name: str, func_name: str, signature_only: bool = False):
            name = (module, op_name, func_name)
            if not signature_only and self.identity is not None:
                served = self._serve(name, handle)
                if served is not None:
                    return served
            text, doc = original(handle, op_name, func_name, signature_only)
            if not signature_only and self.identity is not None:
                self.pending = (text, name, doc)
            return text, doc

        return generate

    def initializer(self, initialize: Any) -> Any:
        """Return MXNet's ``_init_op_module`` or ``_init_np_op_module``, served.

        During the call (while the import runs), the source writer of the module of its
        ``make_op_func`` is :meth:`generator`'s.
        """

        @functools.wraps(initialize)
        def served(*args: Any, **kwargs: Any) -> Any:
            make = kwargs.get("make_op_func", args[-1] if args else None)
            names = getattr(getattr(make, "__code__", None), "co_names", ())
            space = getattr(make, "__globals__", {})
            found = [n for n in _GENERATORS if n in names and n in space]
            if self.identity is None or len(found) != 1:
                return initialize(*args, **kwargs)
            original = space[found[0]]
            space[found[0]] = self.generator(original, str(space.get("__name__")))
            try:
                return initialize(*args, **kwargs)
            finally:
                space[found[0]] = original

        served.mxoid_serves = initialize  # type: ignore[attr-defined]
        return served

    def serve(self, base: Any) -> None:
        """Serve MXNet's sources from the file: ``base`` is ``mxnet.base``, just loaded.

        Its two functions that make the operator functions become :meth:`initializer`'s.
        """
        self.serve_sources(identity(base))
        for name in _INITIALIZERS:
            if callable(vars(base).get(name)):
                setattr(base, name, self.initializer(getattr(base, name)))

    @staticmethod
    def restore() -> None:
        """Give MXNet's modules back their own functions that :meth:`serve` replaced."""
        for name, module in list(sys.modules.items()):
            if not name.startswith("mxnet") or module is None:
                continue
            space = vars(module)
            for attribute in _INITIALIZERS:
                own = getattr(space.get(attribute), "mxoid_serves", None)
                if own is not None:
                    space[attribute] = own

    def save(self) -> bool:
        """Write what this import used if it compiled or wrote anything.

        False where it cannot.
        """
        used, self.known, self.used = self.used, {}, {}  # free them
        noted, self.sources, self.noted = self.noted, {}, {}
        if self.file is not None:
            self.file.close()
            self.file = None
        if not (self.compiled or self.generated) or not used:
            return True
        sources: Dict[str, Any] = {}
        if self.identity is not None and noted:
            sources[self.identity] = noted
        sources.update(self._others(used))  # kept whether or not this import noted any
        try:
            _file.write(self.path, used, sources)
            _remove_former(self.path)
        except OSError:
            return False
        return True

    def _others(self, codes: Dict[bytes, Any]) -> Dict[str, Any]:
        """Return the sources of :data:`OTHER_INSTALLS` other installs in the file now.

        The codes they need, where the file has them, go into ``codes``.
        """
        file = _file.CacheFile(self.path)
        try:
            others = [i for i in file.identities() if i != self.identity][:OTHER_INSTALLS]
            kept = {i: file.sources(i) for i in others}
            kept = {i: entries for i, entries in kept.items() if entries}
            wanted = {
                entry[-1]
                for entries in kept.values()
                for entry in entries.values()
                if isinstance(entry, tuple) and entry and isinstance(entry[-1], bytes)
            }
            if wanted - codes.keys():
                for key, code in file.codes().items():
                    if key in wanted:
                        codes.setdefault(key, code)
            return kept
        finally:
            file.close()
