"""Extensions: objects that act on the main loop at its hooks; the whole Extension API.

:mod:`.base` holds the Extension class and its firing conditions,
:mod:`.predicates` the predicates they use (:class:`OnLogRecord`, the counts
:func:`every_n_batches`...); :mod:`.dispatch` calls the hooks in order. The
extensions, by theme: :mod:`.evaluation` (Evaluate) and
:mod:`.monitoring` (TrainingMonitoring), which share
:mod:`.metrics_extension`; :mod:`.stopping` (FinishAfter, EarlyStopping,
NaNGuard), :mod:`.selection` (TrackBest), :mod:`.training`
(LearningRateSchedule, ReduceLROnPlateau, ClipGradientNorm), :mod:`.inspection`
(Monitor), :mod:`.data_check` (DataCheck), :mod:`.saveload` (Checkpoint), :mod:`.printing`
(Printing), :mod:`.progress` (ProgressBar), :mod:`.timing` (Timing), :mod:`.log_writers`
(JSONLinesLog, CSVLog), :mod:`.tensorboard` (TensorBoard), :mod:`.averaging`
(ExponentialMovingAverage) and :mod:`.swa` (StochasticWeightAveraging).
"""

from .averaging import ExponentialMovingAverage
from .base import FIRING_KEYWORDS, HOOKS, Extension, OnLogRecord
from .data_check import DataCheck, DataError
from .evaluation import Evaluate
from .inspection import Monitor
from .log_writers import CSVLog, JSONLinesLog
from .monitoring import TrainingMonitoring
from .predicates import after_n_batches, after_n_epochs, every_n_batches, every_n_epochs
from .printing import Printing
from .progress import ProgressBar
from .saveload import Checkpoint
from .selection import TrackBest
from .stopping import EarlyStopping, FinishAfter, NaNGuard
from .swa import StochasticWeightAveraging
from .tensorboard import TensorBoard
from .timing import Timing
from .training import ClipGradientNorm, LearningRateSchedule, ReduceLROnPlateau

__all__ = [
    "FIRING_KEYWORDS",
    "HOOKS",
    "CSVLog",
    "Checkpoint",
    "ClipGradientNorm",
    "DataCheck",
    "DataError",
    "EarlyStopping",
    "Evaluate",
    "ExponentialMovingAverage",
    "Extension",
    "FinishAfter",
    "JSONLinesLog",
    "LearningRateSchedule",
    "Monitor",
    "NaNGuard",
    "OnLogRecord",
    "Printing",
    "ReduceLROnPlateau",
    "ProgressBar",
    "StochasticWeightAveraging",
    "TensorBoard",
    "Timing",
    "TrackBest",
    "TrainingMonitoring",
    "after_n_batches",
    "after_n_epochs",
    "every_n_batches",
    "every_n_epochs",
]
