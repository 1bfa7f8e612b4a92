"""The records of a log file as ``mxoid show`` and ``mxoid plot`` choose and print them.

- :func:`read_rows`: a log file's rows, with the errors a user can act on;
- :func:`select_records`: the records asked for by name or shell pattern, or every one
  that holds numbers; :func:`plot_records`: those ``mxoid plot`` draws by default;
- :func:`format_table`: rows as a text table, a line per row.

Nothing here needs MXNet.
"""

from __future__ import annotations

import fnmatch
import math
from typing import Any, Dict, List, Optional, Sequence

from ..errors import InputError
from .files import EPOCHS_DONE, ITERATION, RUN, read_log
from .records import TIMING_RECORDS, is_marker

__all__ = [
    "format_table",
    "is_number",
    "numeric_record",
    "plot_records",
    "read_rows",
    "record_names",
    "select_records",
    "split_names",
]

_CELL_WIDTH = 40


def read_rows(path: str, all_runs: bool = False) -> List[Dict[str, Any]]:
    """Return the rows of the log file ``path`` (:func:`~mxoid.log.files.read_log`).

    Raises
    ------
    InputError
        For a folder, a missing or unreadable file, a file that is not a log, or a log
        with no rows yet.
    """
    try:
        rows = read_log(path, all_runs=all_runs)
    except IsADirectoryError:
        raise InputError(f"{path}: is a folder, not a log file") from None
    except OSError as error:
        raise InputError(f"{path}: {error.strerror or error}") from None
    except ValueError as error:
        raise InputError(str(error)) from None
    if not rows:
        raise InputError(f"{path}: the log holds no rows yet (only a run header)")
    return rows


def is_number(value: Any) -> bool:
    """Whether ``value`` is an int or a float (not a bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def record_names(rows: Sequence[Dict[str, Any]]) -> List[str]:
    """Every record name, in the order they first appear."""
    names: Dict[str, None] = {}
    for row in rows:
        names.update((name, None) for name in row if name not in (RUN, ITERATION, EPOCHS_DONE))
    return list(names)


def numeric_record(rows: Sequence[Dict[str, Any]], name: str) -> bool:
    """Whether record ``name`` holds numbers (and only numbers) in ``rows``."""
    values = [row[name] for row in rows if row.get(name) is not None]
    return bool(values) and all(is_number(value) for value in values)


def select_records(
    rows: Sequence[Dict[str, Any]], wanted: Optional[Sequence[str]], path: str = "the log"
) -> List[str]:
    """Return the records to show.

    They are ``wanted`` (names or shell patterns such as ``'valid_*'``, in
    that order), or by default every record holding numbers.

    Raises
    ------
    InputError
        For a name the log does not hold or a pattern that matches nothing.
    """
    names = record_names(rows)
    if not wanted:
        chosen = [name for name in names if numeric_record(rows, name)]
        if not chosen:
            raise InputError(
                f"{path}: no record holds numbers; its records are {', '.join(names) or 'none'}"
            )
        return chosen
    chosen: List[str] = []
    for item in wanted:
        if any(char in item for char in "*?["):
            matched = [name for name in names if fnmatch.fnmatchcase(name, item)]
            if not matched:
                raise InputError(
                    f"{path}: no record matches {item!r}; its records are {', '.join(names)}"
                )
        elif item in names:
            matched = [item]
        else:
            raise InputError(f"{path}: unknown record {item!r}; its records are {', '.join(names)}")
        chosen += [name for name in matched if name not in chosen]
    return chosen


def split_names(values: Optional[Sequence[str]]) -> Optional[List[str]]:
    """Names given on a command line, separated by spaces or commas (None for none)."""
    if not values:
        return None
    return [name for value in values for name in value.split(",") if name]


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.6g}" if math.isfinite(value) else str(value)
    text = str(value)
    return text if len(text) <= _CELL_WIDTH else text[: _CELL_WIDTH - 3] + "..."


def format_table(
    rows: Sequence[Dict[str, Any]], records: Sequence[str], all_runs: bool = False
) -> str:
    """Return the rows holding any of ``records`` as a text table, a line per row."""
    columns = ([RUN] if all_runs else []) + [ITERATION, EPOCHS_DONE] + list(records)
    shown = [row for row in rows if any(row.get(name) is not None for name in records)]
    cells = [[_cell(row.get(name)) for name in columns] for row in shown]
    widths = [max([len(name)] + [len(line[i]) for line in cells]) for i, name in enumerate(columns)]
    lines = ["  ".join(name.rjust(width) for name, width in zip(columns, widths))]
    lines += ["  ".join(cell.rjust(width) for cell, width in zip(line, widths)) for line in cells]
    return "\n".join(lines)


def plot_records(rows: Sequence[Dict[str, Any]]) -> List[str]:
    """Return the records ``mxoid plot`` draws by default: the numeric ones that measure.

    Markers (``<record>_best_iteration``, ``<record>_new_best``,
    ``<record>_best_checkpoint``) and the timings of Timing are left out.
    """
    return [
        name
        for name in record_names(rows)
        if numeric_record(rows, name) and not is_marker(name) and name not in TIMING_RECORDS
    ]
