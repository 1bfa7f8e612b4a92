"""Packages whose public names are imported on first use.

The package root and :mod:`mxoid.distributed` build their ``__getattr__`` and
``__dir__`` with :func:`lazy_exports`, so that ``mxoid show`` and ``mxoid
launch`` start without loading MXNet. It lives in a module of its own so that
a subpackage can use it without importing the package root (which imports the
subpackages: a circle).
"""

import sys
from importlib import import_module
from typing import Any, Dict, List, Tuple

__all__ = ["lazy_exports"]


def lazy_exports(package: str, exports: Dict[str, str]) -> Tuple[Any, Any]:
    """Return ``__getattr__`` and ``__dir__`` for a package whose names are imported on use.

    ``exports`` maps each public name to the submodule (relative to ``package``) defining it.
    A name is imported on its first use and then kept in the package, so the next use is
    an ordinary attribute.

    Examples
    --------
    In a package's ``__init__.py``::

        _EXPORTS = {"ServerOptimizer": "servers", "shard": "sharding"}
        __all__ = sorted(_EXPORTS)
        __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
    """
    module = sys.modules[package]

    def getattr_(name: str) -> Any:
        where = exports.get(name)
        if where is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(import_module(f".{where}", package), name)
        setattr(module, name, value)
        return value

    def dir_() -> List[str]:
        return sorted(set(vars(module)) | set(exports))

    return getattr_, dir_
