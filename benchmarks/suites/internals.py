"""The mxoid internals the suites measure, imported here and nowhere else.

Public names (``mxoid.MainLoop``, ``mxoid.extensions``, ...) are imported where used;
these are private to mxoid and move with its layout: change them here.
"""

from mxoid.executor_manager.private_heads import COUNTING_SUFFIX
from mxoid.extensions.dispatch import HookDispatcher
from mxoid.update.fused_updater import FusedUpdater, fused_kernel

__all__ = ["COUNTING_SUFFIX", "FusedUpdater", "HookDispatcher", "fused_kernel"]
