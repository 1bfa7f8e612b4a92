"""Extensions: objects that act on the main loop at its hooks.

Grouped by theme: :mod:`.base` (the Extension class and its firing
conditions), :mod:`.stopping` (ending training).
"""
from .base import HOOKS, Extension
from .saveload import Checkpoint
from .stopping import FinishAfter

__all__ = ["HOOKS", "Checkpoint", "Extension", "FinishAfter"]
