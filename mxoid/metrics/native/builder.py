"""Builds the fused metric operator's library: the Python standard library only, no MXNet.

:mod:`mxoid.metrics.native` runs this file as a script of its own (``python builder.py
REQUEST``, a JSON request) to build in the background while a first loop trains on
MXNet's operators, and calls :func:`build` itself to build in the foreground
(``mxoid native``). Either way one process builds for a machine at a time: the one that
holds the claim (``TARGET.building``, made with ``O_EXCL``). It compiles into a file of
its own, renames it into place (no process ever loads a half-written library), and on a
failure leaves the reason in ``TARGET.failed`` with the compiler it was built with, so
that later processes say why instead of compiling again (another compiler, or removing
the file, tries again).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional

BUILD_TIMEOUT = 300.0
"""Seconds a compilation may take before it is abandoned."""

FLAGS = ("-O2", "-std=c++11", "-shared", "-fPIC")


class BuildError(Exception):
    """The library could not be built; the message says why."""


def claim(target: str) -> bool:
    """Claim the build of ``target`` for this machine; False when another process holds it.

    A claim older than two build timeouts is one whose builder was killed: it is taken over.
    """
    path = target + ".building"
    for _ in range(2):
        try:
            handle = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            try:
                if time.time() - os.path.getmtime(path) <= 2 * BUILD_TIMEOUT:
                    return False
                os.unlink(path)
            except OSError:  # the builder just finished and removed it: look again
                pass
            continue
        with os.fdopen(handle, "w") as f:
            f.write(f"{os.getpid()}\n")
        return True
    return False


def building(target: str) -> bool:
    """Return True while a process holds the claim on ``target``'s build."""
    path = target + ".building"
    try:
        return time.time() - os.path.getmtime(path) <= 2 * BUILD_TIMEOUT
    except OSError:
        return False


def failure(target: str, compiler: List[str]) -> Optional[str]:
    """Return why the last build of ``target`` with ``compiler`` failed (None: it did not)."""
    try:
        with open(target + ".failed") as f:
            record = json.load(f)
    except (OSError, ValueError):
        return None
    if record.get("compiler") != compiler:
        return None
    return str(record.get("reason"))


def build(request: Dict) -> None:
    """Build ``request["target"]`` from ``request["sources"]``, then release the claim.

    The caller holds the claim. Raises :class:`BuildError` after leaving the reason in
    ``TARGET.failed``.
    """
    target, compiler = request["target"], request["compiler"]
    try:
        _compile(target, compiler, request["include"], request["sources"])
        try:
            os.unlink(target + ".failed")
        except OSError:
            pass
    except BuildError as error:
        _record_failure(target, compiler, str(error))
        raise
    finally:
        try:
            os.unlink(target + ".building")
        except OSError:
            pass


def _compile(target: str, compiler: List[str], include: str, sources: List[str]) -> None:
    directory = os.path.dirname(target)
    _remove_abandoned(directory)
    try:
        handle, partial = tempfile.mkstemp(suffix=".so", prefix=".building-", dir=directory)
        os.close(handle)
    except OSError as error:
        raise BuildError(f"cannot write to the cache directory {directory}: {error}") from None
    command = [*compiler, *FLAGS, "-I", include, *sources, "-o", partial]
    try:
        try:
            done = subprocess.run(
                command, capture_output=True, text=True, timeout=BUILD_TIMEOUT, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as error:
            raise BuildError(f"{' '.join(compiler)} failed to run: {error}") from None
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            raise BuildError(
                f"{' '.join(compiler)} failed (status {done.returncode}): {' / '.join(tail)}"
            )
        os.replace(partial, target)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)


def _record_failure(target: str, compiler: List[str], reason: str) -> None:
    record = {"compiler": compiler, "reason": reason, "time": time.time()}
    try:
        handle, partial = tempfile.mkstemp(prefix=".failed-", dir=os.path.dirname(target))
        with os.fdopen(handle, "w") as f:
            json.dump(record, f)
        os.replace(partial, target + ".failed")
    except OSError:  # an unwritable cache: the reason is given in this process only
        pass


def _remove_abandoned(directory: str) -> None:
    """Remove partial libraries of builds that were killed (older than two build timeouts)."""
    now = time.time()
    for name in os.listdir(directory):
        if name.startswith((".building-", ".failed-")):
            path = os.path.join(directory, name)
            try:
                if now - os.path.getmtime(path) > 2 * BUILD_TIMEOUT:
                    os.unlink(path)
            except OSError:  # another process removed or renamed it
                pass


if __name__ == "__main__":  # the background build: python builder.py REQUEST
    # Stopped by the process that started it, when that one ends first: SIGTERM unwinds
    # build() (the compiler killed, the partial file and the claim removed), so that a
    # later process builds again from the start.
    signal.signal(signal.SIGTERM, lambda number, frame: sys.exit(128 + number))
    try:
        build(json.loads(sys.argv[1]))
    except BuildError:
        sys.exit(1)
