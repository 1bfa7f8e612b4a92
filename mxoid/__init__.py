"""mxoid: a Blocks-style, extensible training loop for Apache MXNet 1.x.

The public names are imported on first use, so that ``mxoid show`` and
``mxoid launch`` start without loading MXNet.
"""
from importlib import import_module
from typing import TYPE_CHECKING, Any, List

__version__ = "0.1.0"

_EXPORTS = {
    "Checkpoint": "extensions",
    "CheckpointError": "checkpoint",
    "CSVLog": "extensions",
    "DataParallelExecutorManager": "executor_manager",
    "EarlyStopping": "extensions",
    "Evaluate": "extensions",
    "Extension": "extensions",
    "FinishAfter": "extensions",
    "JSONLinesLog": "extensions",
    "LearningRateSchedule": "extensions",
    "MainLoop": "main_loop",
    "NaNGuard": "extensions",
    "Printing": "extensions",
    "ProgressBar": "extensions",
    "TensorBoard": "extensions",
    "Timing": "extensions",
    "TrackBest": "extensions",
    "TrainingLog": "log",
    "TrainingMonitoring": "extensions",
    "TrainingStatus": "log",
    "allreduce_sums": "distributed",
    "read_log": "log_files",
    "shard": "sharding",
}

__all__ = [
    "CSVLog",
    "Checkpoint",
    "CheckpointError",
    "DataParallelExecutorManager",
    "EarlyStopping",
    "Evaluate",
    "Extension",
    "FinishAfter",
    "JSONLinesLog",
    "LearningRateSchedule",
    "MainLoop",
    "NaNGuard",
    "Printing",
    "ProgressBar",
    "TensorBoard",
    "Timing",
    "TrackBest",
    "TrainingLog",
    "TrainingMonitoring",
    "TrainingStatus",
    "allreduce_sums",
    "read_log",
    "shard",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'mxoid' has no attribute {name!r}")
    value = getattr(import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> List[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:  # pragma: no cover
    from .checkpoint import CheckpointError
    from .distributed import allreduce_sums
    from .executor_manager import DataParallelExecutorManager
    from .extensions import (Checkpoint, CSVLog, EarlyStopping, Evaluate, Extension, FinishAfter,
                             JSONLinesLog, LearningRateSchedule, NaNGuard, Printing, ProgressBar,
                             TensorBoard, Timing, TrackBest, TrainingMonitoring)
    from .log import TrainingLog, TrainingStatus
    from .log_files import read_log
    from .main_loop import MainLoop
    from .sharding import shard
