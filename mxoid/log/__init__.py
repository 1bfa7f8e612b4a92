"""The training log: the status, the rows of records, record names and values, log files.

- :mod:`.status`: :class:`TrainingStatus`, the loop's counters and flags;
- :mod:`.training_log`: :class:`TrainingLog`, iteration -> row of records;
- :mod:`.records`: the records the loop and the built-in extensions write, reading a
  record once per write, and plain values for storage and display;
- :mod:`.files`: the JSON-lines and CSV files the log writers write, and :func:`read_log`;
- :mod:`.curves`: record names grouped into metric families, and epoch positions;
- :mod:`.table`: the records ``mxoid show`` and ``mxoid plot`` choose, and the table.

Nothing here needs MXNet, so that ``mxoid show`` starts fast.
"""

from .files import read_log
from .status import TrainingStatus
from .training_log import TrainingLog

__all__ = ["TrainingLog", "TrainingStatus", "read_log"]
