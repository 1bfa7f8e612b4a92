"""The training log and status."""
from .status import TrainingStatus
from .training_log import TrainingLog

__all__ = ["TrainingLog", "TrainingStatus"]
