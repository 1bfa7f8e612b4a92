#!/usr/bin/env python3
"""Install mxoid from this clone with pip, on every Python mxoid supports (3.9 to 3.13).

    python install.py -e '.[examples]'     # the README's first command
    python install.py -e '.[test]'         # the README's second command

The arguments are those of ``pip install``, passed on as they are. On Python 3.9 to
3.12 this runs ``python -m pip install ARGUMENTS``, then, for an editable install
of this clone, the bytecode step below.

On Python 3.13 one step comes first. MXNet 1.9.1's metadata asks for ``numpy<2``,
but NumPy 1.x has no wheel for Python 3.13 (pip would build NumPy 1.26 from source
for minutes, if at all), and pip has no way to override a dependency's requirement
(``pip install . 'numpy>=2'`` is ResolutionImpossible). So the installer installs
``mxnet==1.9.1`` without its dependencies, removes the ``<2`` cap from the ``numpy``
line of the installed copy's metadata (its ``METADATA`` file, and that file's hash
in ``RECORD``), then runs ``pip install ARGUMENTS``: pip then installs MXNet's other
requirements and the newest NumPy 2.x, and keeps them on later installs. mxoid's
compatibility layer (``mxoid/compat.py``) is what makes MXNet 1.9.1 run on NumPy 2.
``pip install --force-reinstall mxnet`` would bring the cap back.

After an editable install of this clone (``-e .``, ``-e '.[test]'``) it compiles
mxoid's bytecode (``python -m compileall -q mxoid``), as pip does for a regular
install: an editable install leaves that to the first import, which never writes
it where ``PYTHONDONTWRITEBYTECODE`` is set, and every process then compiles
mxoid's modules again (0.3 to 0.6 s of CPU each: the test suite starts hundreds).
``--no-compile`` (pip's own option) leaves it out.

It prints every command it runs, and exits with pip's status.
"""

from __future__ import annotations

import base64
import hashlib
import importlib
import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path
from typing import List, Optional, Sequence

HERE = Path(__file__).resolve().parent
MXNET = "mxnet==1.9.1"
NEEDS_UNCAPPED_NUMPY = (3, 13)
"""From this Python on NumPy 1.x has no wheel, so MXNet's ``numpy<2`` must go."""
# pip options without a value, and those with one, that the MXNet step honours too.
FLAGS = {"--no-cache-dir", "-q", "-qq", "--quiet", "-v", "--verbose", "--user", "--no-input"}
FLAGS |= {"--break-system-packages", "--disable-pip-version-check", "--pre"}
VALUED = {"-i", "--index-url", "--extra-index-url", "-f", "--find-links", "--trusted-host"}
VALUED |= {"--proxy", "--cert", "--timeout", "--retries"}


def pip(arguments: Sequence[str]) -> int:
    """Run ``python -m pip install ARGUMENTS`` with this interpreter; return its status."""
    command = [sys.executable, "-m", "pip", "install", *arguments]
    print("$ " + " ".join(command), flush=True)
    return subprocess.call(command)


def editable_clone(arguments: Sequence[str]) -> bool:
    """Return True when ``arguments`` install this clone in editable mode (and may compile)."""
    if "--no-compile" in arguments:
        return False
    for flag, value in zip(arguments, list(arguments[1:]) + [""]):
        if flag.startswith("--editable="):
            flag, value = "-e", flag.split("=", 1)[1]
        elif flag.startswith("-e") and len(flag) > 2:
            flag, value = "-e", flag[2:]
        if flag in ("-e", "--editable"):
            path = Path(value.split("[", 1)[0] or ".").resolve()
            if path == HERE:
                return True
    return False


def compile_bytecode(package: Path) -> int:
    """Compile ``package``'s bytecode (``python -m compileall -q``); return the status."""
    command = [sys.executable, "-m", "compileall", "-q", str(package)]
    print("$ " + " ".join(command), flush=True)
    return subprocess.call(command)


def shared_options(arguments: Sequence[str]) -> List[str]:
    """Return the options of ``arguments`` that apply to any install (cache, index, output)."""
    kept: List[str] = []
    waiting = False
    for argument in arguments:
        name = argument.split("=", 1)[0]
        if waiting:
            kept.append(argument)
            waiting = False
        elif argument in FLAGS or (name in VALUED and "=" in argument):
            kept.append(argument)
        elif argument in VALUED:
            kept.append(argument)
            waiting = True
    return kept


def uncapped(requirement: str) -> str:
    """Return a ``Requires-Dist`` value without its upper bounds.

    ``numpy (<2.0.0,>1.16.0)`` gives ``numpy (>1.16.0)``, ``numpy<2,>=1.17`` ``numpy>=1.17``.
    """
    match = re.match(r"\s*([A-Za-z0-9_.-]+)\s*(\(?)([^;)]*)(\)?)(.*)$", requirement)
    if match is None:
        return requirement
    name, opening, specifiers, closing, rest = match.groups()
    kept = [s.strip() for s in specifiers.split(",") if s.strip() and not s.strip().startswith("<")]
    if not kept:
        return f"{name}{rest}".rstrip()
    joined = ",".join(kept)
    return f"{name} ({joined}){rest}" if opening else f"{name}{joined}{rest}"


def record_hash(data: bytes) -> str:
    """Return the hash of a file's contents as a wheel's ``RECORD`` writes it."""
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return "sha256=" + digest.decode("ascii")


def remove_numpy_cap(dist_info: Path) -> bool:
    """Remove the upper bound of the ``numpy`` requirement from an installed ``*.dist-info``.

    Rewrites ``METADATA`` and its line in ``RECORD``; returns whether anything changed.
    """
    metadata = dist_info / "METADATA"
    text = metadata.read_text(encoding="utf-8")
    lines = text.splitlines(keepends=True)
    for i, line in enumerate(lines):
        if re.match(r"Requires-Dist:\s*numpy\b", line, re.I):
            value = line.split(":", 1)[1].strip()
            lines[i] = f"Requires-Dist: {uncapped(value)}\n"
    new = "".join(lines)
    if new == text:
        return False
    data = new.encode("utf-8")
    metadata.write_bytes(data)
    record = dist_info / "RECORD"
    if record.is_file():
        entry = f"{dist_info.name}/METADATA,"
        rows = record.read_text(encoding="utf-8").splitlines(keepends=True)
        rows = [
            f"{entry}{record_hash(data)},{len(data)}\n" if row.startswith(entry) else row
            for row in rows
        ]
        record.write_text("".join(rows), encoding="utf-8")
    return True


def installed_dist_info(name: str) -> Optional[Path]:
    """Return the ``*.dist-info`` folder of an installed distribution, or None."""
    importlib.invalidate_caches()
    try:
        distribution = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return None
    for file in distribution.files or ():
        if file.name == "METADATA":
            return Path(str(distribution.locate_file(file))).parent
    return None


def install_mxnet_uncapped(options: Sequence[str]) -> int:
    """Install MXNet 1.9.1 without its dependencies, and take its ``numpy<2`` cap away."""
    status = pip(["--no-deps", *options, MXNET])
    if status:
        return status
    dist_info = installed_dist_info("mxnet")
    if dist_info is None:
        print("install.py: mxnet was installed but its metadata is not found", file=sys.stderr)
        return 1
    if remove_numpy_cap(dist_info):
        print(
            f"install.py: removed the numpy<2 cap of MXNet 1.9.1 in {dist_info / 'METADATA'} "
            f"(NumPy 1.x has no wheel for Python {sys.version_info[0]}.{sys.version_info[1]}; "
            "mxoid runs MXNet on NumPy 2)",
            flush=True,
        )
    return 0


def main(arguments: Sequence[str]) -> int:
    """Install as the module docstring says."""
    if not arguments or arguments[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if arguments else 2
    if sys.version_info[:2] >= NEEDS_UNCAPPED_NUMPY:
        status = install_mxnet_uncapped(shared_options(arguments))
        if status:
            return status
    status = pip(arguments)
    if status == 0 and editable_clone(arguments):
        status = compile_bytecode(HERE / "mxoid")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
