"""``distutils.version`` for MXNet 1.9.1: cheaply where it exists, a stand-in where not.

MXNet compares NumPy's version twice with ``distutils.version``'s ``LooseVersion`` and
``StrictVersion``.

- Where ``distutils`` imports (Python <= 3.11, or setuptools' start-up shim,
  ``distutils-precedence.pth``, which is on by default wherever setuptools is
  installed), the start-up hook of :mod:`mxoid.compat` lends MXNet's import the very
  file that ``import distutils.version`` would run (:func:`lend`), loaded alone, and
  takes it back after the import (:func:`take_back`): through the shim, that import
  imports all of setuptools, 0.05-0.1 CPU-seconds of every ``import mxnet``. The
  program's own ``import distutils`` later is served, and warns, as without mxoid.
- Where it does not (Python 3.12+ without the shim), :func:`provide` installs
  setuptools' copy, run alone, where setuptools is installed, else
  :func:`version_module`: for good, since MXNet imports it again in some functions.

This module imports nothing outside the standard library: the start-up hook loads it by
its path, before MXNet or mxoid are imported.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import re
import sys
import types
from typing import Any, Optional, Sequence

__all__ = ["lend", "native", "provide", "take_back", "version_module"]


def native() -> bool:
    """Tell whether ``import distutils`` works without mxoid.

    It does on Python <= 3.11 (the standard library's), or where setuptools' start-up
    shim (``distutils-precedence.pth``) serves it.
    """
    return sys.version_info < (3, 12) or _shim()


def _shim() -> bool:
    return any(type(finder).__module__ == "_distutils_hack" for finder in sys.meta_path)


def setuptools_version_file() -> Optional[str]:
    """Find setuptools' copy of ``distutils/version.py`` without importing setuptools."""
    spec = importlib.machinery.PathFinder.find_spec("setuptools")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(list(spec.submodule_search_locations)[0], "_distutils", "version.py")
    return path if os.path.isfile(path) else None


def _version_file() -> Optional[str]:
    """Find the ``distutils/version.py`` that ``import distutils.version`` would run here."""
    if _shim():  # setuptools serves distutils: its copy
        return setuptools_version_file()
    stdlib = os.path.join(os.path.dirname(os.__file__), "distutils", "version.py")
    return stdlib if os.path.isfile(stdlib) else None


def _load_version(path: str) -> Optional[types.ModuleType]:
    spec = importlib.util.spec_from_file_location("distutils.version", path)
    if spec is None or spec.loader is None:
        return None
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception:  # noqa: BLE001  (then MXNet imports distutils as it would)
        return None
    return module


def lend() -> Optional[types.ModuleType]:
    """Lend MXNet's import the ``distutils.version`` that it would import, loaded alone.

    MXNet imports ``distutils.version`` (two comparisons of NumPy's version); where
    setuptools serves distutils, as it does by default wherever it is installed, that
    import imports setuptools: 0.05-0.1 of the 0.6 CPU-seconds of ``import mxnet``. The
    same file (setuptools' copy there, else the standard library's), run alone, gives
    MXNet classes of the same code; :func:`take_back` takes the module
    back after the import, so that the program's own ``import distutils`` later is
    served as without mxoid (those classes are then that import's, not MXNet's). None
    where nothing is lent (``distutils.version`` imported already, or only mxoid's own
    version module can serve: :func:`provide`).
    """
    if "distutils.version" in sys.modules or not native():
        return None
    path = _version_file()
    module = _load_version(path) if path else None
    if module is not None:
        sys.modules["distutils.version"] = module
    return module


def take_back(module: Optional[types.ModuleType]) -> None:
    """Take back what :func:`lend` lent, if it is still there."""
    if module is not None and sys.modules.get("distutils.version") is module:
        del sys.modules["distutils.version"]


def provide() -> None:
    """Make ``from distutils.version import LooseVersion`` work where distutils is gone.

    That is Python 3.12+ without setuptools' shim: setuptools' copy, run alone, where
    setuptools is installed, else :func:`version_module`.
    """
    if "distutils.version" in sys.modules or native():
        return
    path = setuptools_version_file()
    module = (_load_version(path) if path else None) or version_module()
    package = sys.modules.get("distutils") or types.ModuleType("distutils")
    package.__path__ = []  # a package, so that distutils.version imports
    package.version = module
    sys.modules.setdefault("distutils", package)
    sys.modules["distutils.version"] = module


def version_module() -> types.ModuleType:
    """``LooseVersion`` and ``StrictVersion``: version strings compared part by part."""
    module = types.ModuleType("distutils.version")

    class LooseVersion:
        def __init__(self, text: str) -> None:
            self.vstring = str(text)
            self.version = [
                int(p) if p.isdigit() else p
                for p in re.split(r"(\d+|[a-z]+|\.)", self.vstring)
                if p and p != "."
            ]

        def _key(self, other: Any) -> Sequence[Any]:
            other = other if isinstance(other, LooseVersion) else LooseVersion(other)
            return [(0, p) if isinstance(p, int) else (1, p) for p in other.version]

        def __eq__(self, other: Any) -> bool:
            return self._key(self) == self._key(other)

        def __lt__(self, other: Any) -> bool:
            return self._key(self) < self._key(other)

        def __le__(self, other: Any) -> bool:
            return self._key(self) <= self._key(other)

        def __gt__(self, other: Any) -> bool:
            return self._key(self) > self._key(other)

        def __ge__(self, other: Any) -> bool:
            return self._key(self) >= self._key(other)

        def __repr__(self) -> str:
            return f"LooseVersion({self.vstring!r})"

    module.LooseVersion = LooseVersion
    module.StrictVersion = LooseVersion
    return module
