"""Extensions: objects that act on the main loop at its hooks.

Grouped by theme: :mod:`.base` (the Extension class and its firing
conditions), :mod:`.stopping` (ending training).
"""
from .base import HOOKS, Extension
from .saveload import Checkpoint
from .log_writers import CSVLog, JSONLinesLog
from .monitoring import Evaluate, TrainingMonitoring
from .printing import Printing, ProgressBar
from .selection import TrackBest
from .stopping import EarlyStopping, FinishAfter, NaNGuard
from .tensorboard import TensorBoard
from .timing import Timing
from .training import LearningRateSchedule

__all__ = ["HOOKS", "Checkpoint", "Extension", "FinishAfter",
           "CSVLog", "EarlyStopping", "JSONLinesLog", "LearningRateSchedule", "NaNGuard",
           "Printing", "ProgressBar", "Timing", "TrackBest",
           "Evaluate", "TrainingMonitoring", "TensorBoard"]
