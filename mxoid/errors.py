"""Readable errors out of MXNet's C++ messages; the command's bad-input error."""

from __future__ import annotations

import re

__all__ = ["InputError", "clean_mxnet_message"]


class InputError(Exception):
    """Bad input to the ``mxoid`` command: one line on standard error, with exit status 1."""


_LOCATION = re.compile(r"^\[\d\d:\d\d:\d\d\]\s+\S+:\d+:\s*")
_NOISE_PREFIXES = ("Stack trace", "Traceback", "File ", "[bt]")
_SPECIFIC = ("Error in operator", "Check failed")
_ERROR_PREFIX = re.compile(r"^(MXNetError|mxnet\.base\.MXNetError):\s*")


def clean_mxnet_message(error: BaseException | str) -> str:
    r"""Return the first meaningful line of an MXNet error, without the C++ trace.

    MXNet 1.x errors carry a timestamped source location and a C++ stack
    trace. Users need the sentence that says what went wrong.

    Parameters
    ----------
    error : BaseException or str
        The error raised by MXNet, or its message.

    Returns
    -------
    str
        One line such as ``"Check failed: ... shape inconsistent"``.

    Examples
    --------
    >>> from mxoid.errors import clean_mxnet_message
    >>> clean_mxnet_message(
    ...     "[17:01:02] src/c_api.cc:12: Error in operator fc: bad shape\n"
    ...     "Stack trace:\n  [bt] (0) ..."
    ... )
    'Error in operator fc: bad shape'
    """
    text = str(error)
    lines = [_ERROR_PREFIX.sub("", _LOCATION.sub("", raw.strip())) for raw in text.splitlines()]
    lines = [line for line in lines if line and not line.startswith(_NOISE_PREFIXES)]
    for line in lines:
        if line.startswith(_SPECIFIC):
            return line
    return lines[0] if lines else text.strip()
