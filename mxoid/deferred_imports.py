"""``requests`` and ``onnx``, which ``import mxnet`` imports, run at their first use.

``import mxnet`` imports ``requests`` (``mx.gluon.utils.download`` uses it) and, where
it is installed, ``onnx`` (the ONNX export uses it): 0.1 of the import's 0.5
CPU-seconds (a fifth), for packages that most programs never use. While MXNet is imported, the
start-up hook of :mod:`mxoid.compat` serves those two imports with a
:class:`DeferredModule`: the package's module, created as the import system creates it
(its ``__spec__``, ``__path__``, ``__file__``... set), whose code runs at the first
access of any other attribute, as :class:`importlib.util.LazyLoader` defers a module.

What stays as it was
--------------------
- The module object in ``sys.modules`` and in MXNet's namespaces is the package's
  module from the start; once its code has run it is an ordinary module (its class
  given back), with everything the import would have given it.
- A package that is not installed raises ``ImportError`` at the import, as before, so
  MXNet's ``try: import onnx / except ImportError`` sees it.
- Importing a submodule (``import onnx.defs``, ``from onnx import helper``) runs the
  package first, as an import would have; ``dir()`` does too. The code runs once, under
  a lock, whichever thread comes first.
- Only the imports MXNet's own import makes are deferred; the program's own
  ``import requests`` before or after is untouched (after MXNet, it gets the module
  MXNet holds, and its first use runs it).

What changes: a package whose code fails (a broken install) fails at its first use
rather than inside ``import mxnet``. ``MXOID_DEFERRED_IMPORTS=0`` turns this off
(``MXOID_NO_COMPAT=1`` turns off the whole start-up hook).

This module imports nothing outside the standard library: the start-up hook loads it by
its path, before MXNet or mxoid are imported.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import threading
import types
from typing import Any, Dict, Optional

__all__ = ["DISABLE", "PACKAGES", "DeferredModule", "enabled", "find_spec", "run"]

DISABLE = "MXOID_DEFERRED_IMPORTS"
"""Set to ``0`` to import ``requests`` and ``onnx`` inside ``import mxnet``, as MXNet does."""

PACKAGES = ("onnx", "requests")
"""The packages MXNet imports at its import and uses only later."""

_LOCK = threading.RLock()
_PENDING: Dict[int, Any] = {}  # id(module) -> the loader whose exec_module runs it


def enabled() -> bool:
    """Tell whether the deferral is on: False where ``MXOID_DEFERRED_IMPORTS=0``."""
    return os.environ.get(DISABLE, "1").strip() != "0"


class DeferredModule(types.ModuleType):
    """A package's module whose code runs at the first access of an attribute it lacks."""

    def __getattr__(self, name: str) -> Any:
        run(self)
        if type(self) is DeferredModule:  # its code is running, in this thread
            raise AttributeError(
                f"partially initialized module {self.__name__!r} has no attribute {name!r}"
            )
        return getattr(self, name)

    def __dir__(self) -> Any:
        run(self)
        return types.ModuleType.__dir__(self)


def run(module: types.ModuleType) -> None:
    """Run a :class:`DeferredModule`'s code (once); nothing for any other module.

    Other threads wait until it has run; the module becomes an ordinary module when it
    has (meanwhile, its own code sees it as a module being imported).
    """
    with _LOCK:
        loader = _PENDING.pop(id(module), None)
        if loader is None:
            return
        try:
            loader.exec_module(module)
        except BaseException:
            if sys.modules.get(module.__name__) is module:  # as a failed import leaves it
                del sys.modules[module.__name__]
            raise
        finally:
            module.__class__ = types.ModuleType


class _Deferring(importlib.abc.Loader):
    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Optional[types.ModuleType]:
        return self.loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        module.__spec__.loader = self.loader  # the package's own, as without the deferral
        module.__loader__ = self.loader
        _PENDING[id(module)] = self.loader
        module.__class__ = DeferredModule


class _Existing(importlib.abc.Loader):
    """The module a deferred package's code imported meanwhile: kept, spec and all."""

    def __init__(self, module: types.ModuleType) -> None:
        self.module, self.spec = module, module.__spec__

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return self.module

    def exec_module(self, module: types.ModuleType) -> None:
        module.__spec__ = self.spec  # the import system set the spec of this loader


def find_spec(fullname: str, path: Any, target: Any, deferring: bool) -> Any:
    """Answer the start-up hook's ``find_spec`` for a module that is not MXNet's.

    A spec that defers the module for one of :data:`PACKAGES` imported while
    ``deferring`` (MXNet's import runs); for a submodule of a deferred package, the
    package is run first, and then None (or the submodule that the package imported
    meanwhile, kept as it is); None for anything else.
    """
    top, dot, _ = fullname.partition(".")
    if not dot:
        if not deferring or fullname not in PACKAGES or fullname in sys.modules:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec  # not installed: the ImportError of the import, as without
        spec.loader = _Deferring(spec.loader)
        return spec
    parent = sys.modules.get(top)
    if type(parent) is not DeferredModule:
        return None
    run(parent)
    existing = sys.modules.get(fullname)
    if existing is None:
        return None
    return importlib.util.spec_from_loader(fullname, _Existing(existing))
