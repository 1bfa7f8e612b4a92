"""mxoid: a Blocks-style, extensible training loop for Apache MXNet 1.x.

The public names are imported on first use, so that ``mxoid show`` and
``mxoid launch`` start without loading MXNet. Modules that moved in mxoid
0.2 (``mxoid.log_files`` is now ``mxoid.log.files``, and the others in
:data:`MOVED`) are still importable under their old names, with a
``DeprecationWarning`` naming the new one.
"""

import importlib.abc
import importlib.util
import sys
import warnings
from importlib import import_module
from typing import TYPE_CHECKING, Any, Optional

from .lazy import lazy_exports

__version__ = "0.5.0"

_EXPORTS = {
    "Checkpoint": "extensions",
    "ClipGradientNorm": "extensions",
    "CheckpointError": "checkpoint",
    "CSVLog": "extensions",
    "DataCheck": "extensions",
    "DataLoaderIter": "data",
    "DataParallelExecutorManager": "executor_manager",
    "EarlyStopping": "extensions",
    "Evaluate": "extensions",
    "Extension": "extensions",
    "ExponentialMovingAverage": "extensions",
    "FinishAfter": "extensions",
    "JSONLinesLog": "extensions",
    "LearningRateSchedule": "extensions",
    "MainLoop": "main_loop",
    "Monitor": "extensions",
    "NaNGuard": "extensions",
    "OnnxExportError": "export",
    "OnLogRecord": "extensions",
    "Predictor": "inference",
    "Prefetch": "data",
    "Printing": "extensions",
    "ProgressBar": "extensions",
    "ReduceLROnPlateau": "extensions",
    "StochasticWeightAveraging": "extensions",
    "TensorBoard": "extensions",
    "Timing": "extensions",
    "TrackBest": "extensions",
    "TrainingLog": "log",
    "TrainingMonitoring": "extensions",
    "TrainingStatus": "log",
    "allreduce_sums": "distributed",
    "average_checkpoints": "checkpoint.averaging",
    "export_onnx": "export",
    "load_params": "checkpoint.loading",
    "quantize": "export",
    "read_log": "log",
    "seed_everything": "checkpoint.random_state",
    "shard": "distributed",
}

__all__ = sorted(_EXPORTS)

MOVED = {
    # mxoid 0.1 -> 0.2
    "mxoid.data_position": "mxoid.data.position",
    "mxoid.dispatch": "mxoid.extensions.dispatch",
    "mxoid.extensions.records": "mxoid.log.records",
    "mxoid.launch_processes": "mxoid.distributed.processes",
    "mxoid.log_files": "mxoid.log.files",
    "mxoid.sharding": "mxoid.distributed.sharding",
    "mxoid.updater": "mxoid.update.fused_updater",
    # mxoid 0.3 -> 0.4: the loop, the executor manager and the update as folders
    "mxoid.checkpoint.compatibility": "mxoid.main_loop.resumption",
    "mxoid.checkpoint.data_position": "mxoid.data.position",
    "mxoid.checkpoint.loop_state": "mxoid.main_loop.state",
    "mxoid.devices": "mxoid.executor_manager.devices",
    "mxoid.fused_updater": "mxoid.update.fused_updater",
    "mxoid.initialization": "mxoid.executor_manager.initialization",
    "mxoid.interrupt": "mxoid.main_loop.interrupt",
    "mxoid.invoke": "mxoid.executor_manager.invoke",
    "mxoid.pacing": "mxoid.executor_manager.pacing",
    "mxoid.private_heads": "mxoid.executor_manager.private_heads",
    # mxoid 0.4 -> 0.5: what the loop trains, behind one seam (mxoid.network)
    "mxoid.gluon": "mxoid.network",
    "mxoid.gluon.network": "mxoid.network.gluon",
    "mxoid.main_loop.buckets": "mxoid.network.buckets",
}
"""Old module names -> where the module lives now (``mxoid.launch`` is kept as a module of
its own, for ``python -m mxoid.launch``; ``mxoid.main_loop``, ``mxoid.executor_manager`` and
``mxoid.update`` are folders now, and import the same names as before)."""


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports a moved module under its old name: the new module, with a warning."""

    def find_spec(
        self, fullname: str, path: Any = None, target: Any = None
    ) -> Optional[importlib.machinery.ModuleSpec]:
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Any:
        warnings.warn(
            f"{spec.name} moved to {MOVED[spec.name]}; import it from there",
            DeprecationWarning,
            stacklevel=2,
        )
        return import_module(MOVED[spec.name])

    def exec_module(self, module: Any) -> None:
        """Nothing to run: the module is the new one, already imported."""


if not any(isinstance(finder, _MovedModules) for finder in sys.meta_path):
    sys.meta_path.append(_MovedModules())

# MXNet 1.9.1 on today's NumPy and Python: the names it needs, added before it is imported.
from . import compat as _compat  # noqa: E402

_compat.install_import_hook()

# In a launched worker, an error anywhere in the script (even before MainLoop) ends the
# worker instead of leaving it in ps-lite's finalize barrier (mxoid.distributed.exits).
if __import__("os").environ.get("DMLC_ROLE") == "worker":
    from . import distributed as _distributed  # noqa: E402, F401


# The public names for type checkers and editors; at run time, __getattr__ imports them on
# first use (they are in __all__, which ruff cannot read, hence the noqa).
if TYPE_CHECKING:  # pragma: no cover
    from .checkpoint import CheckpointError  # noqa: F401
    from .checkpoint.averaging import average_checkpoints  # noqa: F401
    from .checkpoint.loading import load_params  # noqa: F401
    from .checkpoint.random_state import seed_everything  # noqa: F401
    from .data import DataLoaderIter, Prefetch  # noqa: F401
    from .distributed import allreduce_sums, shard  # noqa: F401
    from .executor_manager import DataParallelExecutorManager  # noqa: F401
    from .export import OnnxExportError, export_onnx, quantize  # noqa: F401
    from .extensions import (  # noqa: F401
        Checkpoint,
        ClipGradientNorm,
        CSVLog,
        DataCheck,
        EarlyStopping,
        Evaluate,
        ExponentialMovingAverage,
        Extension,
        FinishAfter,
        JSONLinesLog,
        LearningRateSchedule,
        Monitor,
        NaNGuard,
        OnLogRecord,
        Printing,
        ProgressBar,
        ReduceLROnPlateau,
        StochasticWeightAveraging,
        TensorBoard,
        Timing,
        TrackBest,
        TrainingMonitoring,
    )
    from .inference import Predictor  # noqa: F401
    from .log import TrainingLog, TrainingStatus, read_log  # noqa: F401
    from .main_loop import MainLoop  # noqa: F401
