"""The file of :mod:`mxoid.operator_cache`: its layout, read and written.

``mxnet-operators-2.<python>.marshal`` holds the compiled operator functions of MXNet
(the codes, by the key of their text) and, for each install that wrote it (other
virtual environments of the same Python), the sources it served. It is laid out in
parts so that an import reads what it uses and maps the rest without reading it
(:class:`CacheFile`), and written whole into a temporary file renamed over it
(:func:`write`), so that a reader sees a whole file or the previous one.

This module imports nothing outside the standard library: at start-up it is loaded by
its path, with :mod:`mxoid.operator_cache`, before MXNet or mxoid are imported.
"""

from __future__ import annotations

import importlib.util
import marshal
import mmap
import os
import time
import types
from typing import Any, Dict, Optional

__all__ = ["HEADER", "SOURCES", "STALE_SECONDS", "CacheFile", "load", "remove_stale", "write"]

HEADER = importlib.util.MAGIC_NUMBER + b" mxoid operator functions 2\n"
"""How the file starts: this Python's magic number and the layout's version."""
SOURCES = "sources"  # the table's entry of the sources: {identity: (start, length)}
STALE_SECONDS = 3600
"""A temporary file this old is the remains of a killed save: the next save removes it."""


class CacheFile:
    """The file, mapped: its table read, each part unmarshalled only when asked for.

    ``HEADER``, the table's length (8 bytes, little-endian), the table
    (``{"codes": (start, length), "sources": {identity: (start, length)}}``, starts
    counted from the end of the table), then the parts: the codes (``{key: code}``) and
    each install's sources (``{(module, operator, function): entry}``). An import reads the
    codes and its own install's sources: not the other installs' (mapped, not copied).
    """

    def __init__(self, path: str) -> None:
        self.data: Any = b""
        self.table: Dict[str, Any] = {}
        self.start = 0  # where the parts begin
        try:
            with open(path, "rb") as file:
                try:
                    self.data = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
                except (OSError, ValueError):  # empty, or a file system without mmap
                    self.data = file.read()
        except OSError:
            return
        if self.data[: len(HEADER)] != HEADER:
            return
        size = int.from_bytes(self.data[len(HEADER) : len(HEADER) + 8], "little")
        table = self._unmarshal(len(HEADER) + 8, size)
        if isinstance(table, dict):
            self.table, self.start = table, len(HEADER) + 8 + size

    def _unmarshal(self, start: int, length: int) -> Any:
        if not (0 <= start and 0 < length and start + length <= len(self.data)):
            return None
        try:
            with memoryview(self.data) as view, view[start : start + length] as part:
                return marshal.loads(part)
        except (EOFError, ValueError, TypeError):
            return None

    def _part(self, place: Any) -> Any:
        if not (isinstance(place, tuple) and len(place) == 2 and self.table):
            return None
        start, length = place
        if not (isinstance(start, int) and isinstance(length, int)):
            return None
        return self._unmarshal(self.start + start, length)

    def codes(self) -> Dict[bytes, types.CodeType]:
        """Return the codes, ``{key: code}`` (empty where missing or damaged)."""
        codes = self._part(self.table.get("codes"))
        if not isinstance(codes, dict):
            return {}
        return {k: v for k, v in codes.items() if isinstance(v, types.CodeType)}

    def identities(self) -> list:
        """Return the installs whose sources the file holds, the last writer's first."""
        sources = self.table.get(SOURCES)
        return [i for i in sources if isinstance(i, str)] if isinstance(sources, dict) else []

    def sources(self, identity: Optional[str]) -> Dict[Any, Any]:
        """Return the sources of the install ``identity`` (empty where none or damaged)."""
        places = self.table.get(SOURCES)
        if identity is None or not isinstance(places, dict) or identity not in places:
            return {}
        entries = self._part(places[identity])
        return entries if isinstance(entries, dict) else {}

    def close(self) -> None:
        """Unmap the file (what was read from it stays)."""
        if isinstance(self.data, mmap.mmap):
            self.data.close()
        self.data = b""


def load(path: str) -> Dict[Any, Any]:
    """Return the whole file: its codes by key, and ``"sources"``: ``{identity: entries}``."""
    file = CacheFile(path)
    try:
        loaded: Dict[Any, Any] = dict(file.codes())
        loaded[SOURCES] = {i: file.sources(i) for i in file.identities()}
        return loaded
    finally:
        file.close()


def write(path: str, codes: Dict[Any, Any], sources: Dict[str, Any]) -> None:
    """Write the file (see :class:`CacheFile`): in a temporary file renamed over it."""
    parts = [marshal.dumps(codes)] + [marshal.dumps(entries) for entries in sources.values()]
    places = [(sum(map(len, parts[:i])), len(part)) for i, part in enumerate(parts)]
    head = marshal.dumps({"codes": places[0], SOURCES: dict(zip(sources, places[1:]))})
    folder = os.path.dirname(path)
    temporary = f"{path}.{os.urandom(6).hex()}.tmp"
    try:
        os.makedirs(folder, exist_ok=True)
        remove_stale(folder, os.path.basename(path))
        with open(temporary, "xb") as file:
            file.write(HEADER + len(head).to_bytes(8, "little") + head)
            for part in parts:
                file.write(part)
        os.replace(temporary, path)
    except OSError:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise


def remove_stale(folder: str, name: str) -> None:
    """Remove the temporary files of saves that were killed (an hour old or more)."""
    for entry in os.scandir(folder):
        if entry.name.startswith(name + ".") and entry.name.endswith(".tmp"):
            try:
                if entry.stat().st_mtime < time.time() - STALE_SECONDS:
                    os.unlink(entry.path)
            except OSError:
                pass
