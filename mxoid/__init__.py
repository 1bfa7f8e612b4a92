"""mxoid: a Blocks-style, extensible training loop for Apache MXNet 1.x."""
from .executor_manager import DataParallelExecutorManager
from .checkpoint import CheckpointError
from .extensions import Checkpoint, Extension, FinishAfter
from .extensions import (CSVLog, EarlyStopping, JSONLinesLog, LearningRateSchedule, NaNGuard,
                         Printing, ProgressBar, Timing, TrackBest)
from .log_files import read_log
from .extensions import Evaluate, TrainingMonitoring
from .extensions import TensorBoard
from .log import TrainingLog, TrainingStatus
from .main_loop import MainLoop
from .distributed import allreduce_sums
from .sharding import shard

__version__ = "0.1.0"

__all__ = [
    "Checkpoint",
    "CheckpointError",
    "DataParallelExecutorManager",
    "Extension",
    "FinishAfter",
    "MainLoop",
    "TrainingLog",
    "TrainingStatus",
    "CSVLog",
    "EarlyStopping",
    "JSONLinesLog",
    "LearningRateSchedule",
    "NaNGuard",
    "Printing",
    "ProgressBar",
    "Timing",
    "TrackBest",
    "read_log",
    "Evaluate",
    "TrainingMonitoring",
    "TensorBoard",
    "allreduce_sums",
    "shard",
]
