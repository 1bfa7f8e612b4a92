r"""Log files of :class:`~mxoid.extensions.JSONLinesLog` and :class:`~mxoid.extensions.CSVLog`.

This module is the one place that knows their format: how values are
written (:func:`encode_json_value`, :func:`encode_csv_cell`) and how files
are read back (:func:`read_log`, :func:`parse_log_file`).

JSON lines (``.jsonl``)
    One JSON object per line, UTF-8, each line ended by ``\n``. Each run
    starts with a header line ``{"run": k, "started": "<ISO 8601 local time
    with offset>", "start_iteration": n}`` (runs numbered from 1; ``n`` is
    the iteration training started or resumed at). Each log row follows as
    ``{"iteration": i, "epochs_done": e, "<record>": value, ...}``: lines
    with a ``"run"`` key are headers, the others rows. Non-finite floats are
    written as the strings ``"NaN"``, ``"Infinity"`` and ``"-Infinity"``
    (also inside lists) and read back as floats; ``null`` is ``None``.
CSV (``.csv``)
    A single header line ``run,iteration,epochs_done,<records in the order
    they first appeared>``, then one line per log row, lines ended by
    ``\n``. An empty cell means the row has no such record (a ``None``
    value is written empty too). Floats are written as Python's ``repr``
    (``nan``, ``inf``, ``-inf`` included), ints as digits, booleans as
    ``True``/``False``, lists as JSON text, strings as they are (quoted by
    the csv module when needed). Reading turns cells that look like ints,
    floats, booleans or JSON lists back into them; everything else stays a
    string.

In both formats a row is an iteration of :class:`~mxoid.log.TrainingLog`
(``epochs_done`` as it stood when the row was complete), written once
complete and flushed, so a crash loses at most the current row. A last
line without its ``\n`` is a torn write: readers ignore it and writers
cut it off before they append.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from .records import RESUMED_FROM

__all__ = [
    "EPOCHS_DONE",
    "ITERATION",
    "RESERVED_NAMES",
    "RESUMED_FROM",
    "RUN",
    "LogFileContents",
    "continued_rows",
    "cut_torn_line",
    "decode_json_value",
    "encode_csv_cell",
    "encode_json_value",
    "parse_log_file",
    "read_log",
]

RUN = "run"
ITERATION = "iteration"
EPOCHS_DONE = "epochs_done"
RESERVED_NAMES = (RUN, ITERATION, EPOCHS_DONE)
"""Column names that records may not take."""

_NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
_INT = re.compile(r"[-+]?\d+")
_FLOAT = re.compile(r"[-+]?(\d+\.?\d*([eE][-+]?\d+)?|\.\d+([eE][-+]?\d+)?|nan|inf)")
NOT_A_LOG = (
    "{path}: not a log file written by JSONLinesLog or CSVLog (those start with a "
    "'{{\"run\": ...}}' line or a 'run,iteration,epochs_done' header)"
)


@dataclass
class LogFileContents:
    """Everything in a log file.

    Attributes
    ----------
    format : {'jsonl', 'csv'}
    columns : list of str
        ``run``, ``iteration``, ``epochs_done``, then the records in the order
        they first appear (for CSV, the header).
    rows : list of dict
        Every row of every run, each with its ``run`` number first.
    runs : int
        The highest run number (0 for an empty file).
    started : dict of int to str
        When each run started (JSON lines only).
    """

    format: str
    columns: List[str] = field(default_factory=lambda: list(RESERVED_NAMES))
    rows: List[Dict[str, Any]] = field(default_factory=list)
    runs: int = 0
    started: Dict[int, str] = field(default_factory=dict)


def encode_json_value(value: Any) -> Any:
    """Return a plain value, its non-finite floats as ``"NaN"``, ``"Infinity"``, ``"-Infinity"``."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, list):
        return [encode_json_value(item) for item in value]
    return value


def decode_json_value(value: Any) -> Any:
    """Undo :func:`encode_json_value`."""
    if isinstance(value, str):
        return _NON_FINITE.get(value, value)
    if isinstance(value, list):
        return [decode_json_value(item) for item in value]
    return value


def encode_csv_cell(value: Any) -> str:
    """Return the CSV cell of a plain value (bool, int, float, str, None or list)."""
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, list):
        return json.dumps(encode_json_value(value))
    return str(value)


def _decode_csv_cell(cell: str) -> Any:
    if cell in ("True", "False"):
        return cell == "True"
    if _INT.fullmatch(cell):
        return int(cell)
    if _FLOAT.fullmatch(cell):
        return float(cell)
    if cell.startswith("["):
        try:
            return decode_json_value(json.loads(cell))
        except ValueError:
            pass
    return cell


def read_log(path: os.PathLike[str] | str, all_runs: bool = False) -> List[Dict[str, Any]]:
    """Return the rows of a log file, oldest first, as dicts.

    Each row holds ``iteration``, ``epochs_done`` and its records, with the
    values they were written with (see the module's notes on formats).

    Parameters
    ----------
    path : str or path-like
        A file written by JSONLinesLog or CSVLog; the format is told from
        its content.
    all_runs : bool, default False
        Return the rows of every run as written, each starting with its
        ``run`` number, instead of the last training: the last run that
        wrote a row, joined with the runs it resumed (:func:`continued_rows`).
        A file with run headers but no rows yet gives an empty list.

    Raises
    ------
    ValueError
        If the file is missing, empty, or not such a log; the message names
        the path.
    """
    contents = parse_log_file(path)
    if all_runs or not contents.rows:
        return contents.rows
    return [{k: v for k, v in row.items() if k != RUN} for row in continued_rows(contents)]


def _runs(contents: LogFileContents) -> List[List[Dict[str, Any]]]:
    """Return the rows of each run, in file order (a run's rows are contiguous)."""
    runs: List[List[Dict[str, Any]]] = []
    for row in contents.rows:
        if not runs or runs[-1][0][RUN] != row[RUN]:
            runs.append([])
        runs[-1].append(row)
    return runs


def _resumed_at(run: List[Dict[str, Any]]) -> Optional[int]:
    first = run[0]
    return first[ITERATION] if RESUMED_FROM in first else None


def continued_rows(contents: LogFileContents, last: Optional[int] = None) -> List[Dict[str, Any]]:
    """Return the rows of one training.

    The training is the last run (or run number ``last``) with the runs it
    resumed. A resumed run supersedes the rows of the run before it from its
    first iteration on; rows come out by iteration, each with its ``run``
    number.
    """
    runs = _runs(contents)
    if last is not None:
        runs = runs[: next(i for i, run in enumerate(runs) if run[0][RUN] == last) + 1]
    if not runs:
        return []
    chain = [runs.pop()]
    while runs and _resumed_at(chain[0]) is not None:
        chain.insert(0, runs.pop())
    rows: List[Dict[str, Any]] = []
    for run in chain:
        start = _resumed_at(run)
        if start is not None:
            rows = [row for row in rows if row[ITERATION] < start]
        rows += run
    return sorted(rows, key=lambda row: row[ITERATION])


def parse_log_file(path: os.PathLike[str] | str) -> LogFileContents:
    """Read a whole log file; a missing or empty file is an error (see :func:`read_log`)."""
    path = os.fspath(path)
    try:
        with open(path, encoding="utf-8", newline="") as f:
            text = f.read()
    except FileNotFoundError:
        raise ValueError(f"{path}: no such log file") from None
    except UnicodeDecodeError:
        raise ValueError(NOT_A_LOG.format(path=path)) from None
    text = text[: text.rfind("\n") + 1]  # a last line without its newline is a torn write
    if not text.strip():
        raise ValueError(f"{path}: the log file is empty")
    if text.startswith("{"):
        return _parse_json_lines(path, text)
    return _parse_csv(path, text)


def _parse_json_lines(path: str, text: str) -> LogFileContents:
    contents = LogFileContents("jsonl")
    run: Optional[int] = None
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except ValueError as error:
            raise ValueError(f"{path}, line {number}: not JSON ({error})") from None
        if not isinstance(item, dict) or (run is None and RUN not in item):
            raise ValueError(NOT_A_LOG.format(path=path))
        if RUN in item:
            run = contents.runs = int(item[RUN])
            contents.started[run] = item.get("started")
            continue
        if ITERATION not in item:
            raise ValueError(f"{path}, line {number}: a row without 'iteration'")
        row = {RUN: run}
        row.update((name, decode_json_value(value)) for name, value in item.items())
        contents.columns += [name for name in row if name not in contents.columns]
        contents.rows.append(row)
    return contents


def _parse_csv(path: str, text: str) -> LogFileContents:
    lines = list(csv.reader(io.StringIO(text)))
    header = lines[0]
    if header[:3] != list(RESERVED_NAMES):
        raise ValueError(NOT_A_LOG.format(path=path))
    contents = LogFileContents("csv", columns=header)
    for number, cells in enumerate(lines[1:], start=2):
        if len(cells) > len(header):
            raise ValueError(f"{path}, line {number}: {len(cells)} cells for {len(header)} columns")
        row = {name: _decode_csv_cell(cell) for name, cell in zip(header, cells) if cell != ""}
        if not isinstance(row.get(RUN), int) or not isinstance(row.get(ITERATION), int):
            raise ValueError(f"{path}, line {number}: 'run' and 'iteration' must be ints")
        contents.runs = max(contents.runs, row[RUN])
        contents.rows.append(row)
    return contents


def cut_torn_line(path: str) -> None:
    """Cut off a last line that lacks its newline (a write torn by a crash)."""
    with open(path, "rb+") as f:
        data = f.read()
        if data and not data.endswith(b"\n"):
            f.truncate(data.rfind(b"\n") + 1)
