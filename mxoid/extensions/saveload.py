"""Saving checkpoints that training resumes from exactly."""

from __future__ import annotations

import logging
import os
from typing import Any, Dict, List, Optional

import mxnet as mx

from ..checkpoint import write_checkpoint
from ..checkpoint.directory import RunDirectory
from ..distributed.servers import is_distributed
from ..log.records import (
    BEST_CHECKPOINT,
    CHECKPOINT_SAVED_TO,
    MISSING,
    NAN_DETECTED,
    RecordReader,
    to_float,
)
from .base import Extension
from .save_points import SavePoints, check_best_everywhere, mxnet_seed
from .save_points import counters as _counters
from .selection import BestValue

__all__ = ["Checkpoint"]

logger = logging.getLogger(__name__)

_HIGHER_IS_BETTER = ("acc", "f1", "auc", "precision", "recall", "top_k")
BEST = "best"


class Checkpoint(Extension):
    """Save everything training needs to resume exactly, atomically.

    Each save writes a folder ``<directory>/checkpoint-<seq>-epoch<E>-batch<B>``
    (format in :mod:`mxoid.checkpoint`): the parameters in MXNet's own format,
    the optimizer states, the loop status and log, every extension's state,
    the random states and the training iterator's position. Resume with
    ``MainLoop(..., resume_from=directory)``. ``<seq>`` counts the saves into
    the directory in the order they were written.

    The directory belongs to one run at a time: while training, the
    extension holds a lock on it (a second process writing into it gets a
    clear error), and a new run refuses a directory that holds checkpoints
    of another run (unless ``require_empty=False``). ``keep_last`` deletes
    only this run's older checkpoints. Checks happen when training starts:
    an unwritable directory is reported then, not at the first save.

    A save is recorded (``checkpoint_saved_to`` in the log) only once its
    folder is in place; a save that fails (full disk, read-only folder, a
    file in the way, a file size limit) raises :class:`CheckpointError`
    saying why and what to do, leaves no half-written folder behind, and
    leaves the previous checkpoints whole.

    MXNet 1.x cannot report the state of its own random generator (dropout
    masks, random augmentation on the device). So that a resumed run draws
    the same numbers as an uninterrupted one, each save reseeds MXNet with a
    seed derived from the loop counters and stores it; resumption sets it
    again. Runs with and without a Checkpoint therefore draw different MXNet
    random numbers after the first save.

    In distributed training every worker runs it, and rank 0 writes: at each
    save every worker gives rank 0 its own random states and iterator position
    (a collective exchange, :mod:`mxoid.extensions.save_points`), which
    ``loop.json`` keeps by rank. Its firing conditions must therefore hold alike
    on every worker (batch and epoch counts do; ``save_best_of`` must name a
    record every worker writes, as Evaluate's), and every worker must see rank
    0's directory to resume (a shared file system).

    Parameters
    ----------
    directory : str or path-like
        Where checkpoints go; created if needed.
    every_n_epochs : int or None, default 1
        Save after every n epochs.
    every_n_batches : int, optional
        Also save every n batches, in the middle of epochs.
    keep_last : int or None, default 3
        Keep this run's newest ``keep_last`` checkpoints, delete its older
        ones. None keeps all.
    save_best_of : str, optional
        A log record (e.g. ``'valid_accuracy'``): whenever it improves, the
        state is also saved to ``<directory>/best`` (never deleted by
        ``keep_last``), and the row gets ``<record>_best_checkpoint``. The
        periodic checkpoint of that row already knows the new best.
    best_mode : {'auto', 'min', 'max'}, default 'auto'
        Whether lower or higher ``save_best_of`` is better; 'auto' means
        higher for names with accuracy, f1, auc, precision or recall, lower
        otherwise (as Keras' ModelCheckpoint).
    require_empty : bool, default True
        Refuse a directory holding checkpoints of another run. False writes
        beside them; ``resume_from`` then takes the newest written.
    prefix : {'model'}
        The prefix of the MXNet files inside a checkpoint; always ``model``.
    **kwargs
        Further firing conditions of :class:`Extension`. Saves also happen
        after training and on interruption (Ctrl-C, SIGTERM); never after an
        error, and never when :class:`NaNGuard` has marked the row with
        ``nan_detected``.

    Attributes
    ----------
    last_saved : str or None
        The folder of the newest checkpoint.
    best : BestValue
        The best value of ``save_best_of`` so far.

    Examples
    --------
    .. code-block:: python

        loop = MainLoop(net, train, extensions=[FinishAfter(after_n_epochs=20),
                        Checkpoint("runs/mlp", every_n_batches=500)],
                        resume_from="runs/mlp")
    """

    rank_zero_only = False  # every worker takes part in a save; rank 0 writes

    def __init__(
        self,
        directory: os.PathLike[str] | str,
        every_n_epochs: Optional[int] = 1,
        every_n_batches: Optional[int] = None,
        keep_last: Optional[int] = 3,
        save_best_of: Optional[str] = None,
        best_mode: str = "auto",
        require_empty: bool = True,
        prefix: str = "model",
        **kwargs: Any,
    ) -> None:
        if not isinstance(directory, (str, os.PathLike)) or not os.fspath(directory):
            raise ValueError(f"Checkpoint needs a directory, a non-empty path; got {directory!r}")
        if keep_last is not None and (
            isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 1
        ):
            raise ValueError(f"keep_last must be at least 1 (or None to keep all), got {keep_last}")
        if best_mode not in ("auto", "min", "max"):
            raise ValueError(f"best_mode must be 'auto', 'min' or 'max', got {best_mode!r}")
        if prefix != "model":
            raise ValueError(
                "the MXNet files inside a checkpoint are always named model-*: "
                f"prefix={prefix!r} is not supported"
            )
        kwargs.setdefault("priority", 200)
        kwargs.setdefault("after_training", True)
        kwargs.setdefault("on_interrupt", True)
        if every_n_epochs:
            kwargs.setdefault("every_n_epochs", every_n_epochs)
        if every_n_batches:
            kwargs.setdefault("every_n_batches", every_n_batches)
        super().__init__(**kwargs)
        self.directory = os.path.abspath(os.fspath(directory))
        self.keep_last = keep_last
        self.require_empty = require_empty
        self.save_best_of = save_best_of
        if best_mode == "auto":
            best_mode = (
                "max"
                if save_best_of and any(word in save_best_of.lower() for word in _HIGHER_IS_BETTER)
                else "min"
            )
        self.best_mode = best_mode
        self.best = BestValue(best_mode)
        self._best_reader = (
            RecordReader(save_best_of, owner="Checkpoint(save_best_of)") if save_best_of else None
        )
        self.prefix = prefix
        self.sequence = 0
        self.last_saved: Optional[str] = None
        self._last_counters: Optional[list] = None
        self._run_directory = RunDirectory(self.directory, BEST, log=logger)
        self._points = SavePoints()
        self._interrupted = False  # distributed: a save on interruption, made after training

    # ------------------------------------------------------------- the run
    @property
    def checkpoint_directory(self) -> str:  # type: ignore[override]
        """The directory of checkpoints (``resume_from`` may name it before it exists)."""
        return self.directory

    @property
    def record_names(self) -> List[str]:
        """``checkpoint_saved_to``, and ``<save_best_of>_best_checkpoint`` with ``save_best_of``."""
        names = [CHECKPOINT_SAVED_TO]
        if self.save_best_of:
            names.append(self.save_best_of + BEST_CHECKPOINT)
        return names

    @property
    def best_value(self) -> Optional[float]:
        """The best value of ``save_best_of`` so far (``best.value``)."""
        return self.best.value

    def before_training(self) -> None:
        """Lock the directory and tidy it; refuse it if it holds another run's checkpoints.

        Tidying removes what interrupted writes left. Another run's checkpoints
        are refused only with ``require_empty`` (the default). Then the
        ``before_training`` conditions fire.
        """
        self._start()
        super().before_training()

    def on_resumption(self) -> None:
        """Lock the directory and tidy it; refuse it if it holds another run's checkpoints.

        Tidying removes what interrupted writes left. Another run's checkpoints
        are refused only with ``require_empty`` (the default). Then the
        ``on_resumption`` conditions fire.
        """
        self._start()
        super().on_resumption()

    def _start(self) -> None:
        if self._distributed():
            check_best_everywhere(self.save_best_of, self.main_loop.extensions)
        if self.main_loop.status.rank != 0:
            return
        self._run_directory.open(self.main_loop.run_id, self.require_empty)

    def _distributed(self) -> bool:
        return is_distributed(self.main_loop.kvstore)

    def after_training(self) -> None:
        """Fire the ``after_training`` conditions (a save, by default), then release the lock.

        In distributed training the save on interruption is made here, at the
        same point on every worker (whether a signal cut training short is each
        worker's own reading of its stop).
        """
        try:
            super().after_training()
            if self._distributed() and {"after_training", "on_interrupt"} & set(self.conditions):
                self._points.gather(self.main_loop)
                if self._interrupted:
                    self.save()
        finally:
            self._interrupted = False
            self._run_directory.close()

    def on_error(self, exception: BaseException) -> None:
        """Release the directory's lock."""
        self._run_directory.close()

    # --------------------------------------------------------------- firing
    def do(self, which_callback: str, *args: Any) -> None:
        """Save a checkpoint (:meth:`save`; on interruption in distributed training, later)."""
        if which_callback == "on_interrupt" and self._distributed():
            self._interrupted = True
            return
        self.save()

    def after_batch(self, batch: Any) -> None:
        """Fire the ``after_batch`` conditions; save ``best`` when ``save_best_of`` improved.

        A new value of ``save_best_of`` is taken first, so a checkpoint saved
        by the conditions already knows the new best.
        """
        improved = self._note_best()
        super().after_batch(batch)
        if improved:
            self._save_best()

    def after_epoch(self) -> None:
        """Fire the ``after_epoch`` conditions; save ``best`` when ``save_best_of`` improved.

        A new value of ``save_best_of`` is taken first, so a checkpoint saved
        by the conditions already knows the new best.
        """
        improved = self._note_best()
        super().after_epoch()
        if improved:
            self._save_best()

    # --------------------------------------------------------------- saving
    def save(self) -> Optional[str]:
        """Save a checkpoint now; return its folder (None when skipped).

        Raises
        ------
        CheckpointError
            When it cannot be written; nothing is recorded then.
        """
        loop = self.main_loop
        status = loop.status
        rank_states = self._points.gather(loop)  # every worker, at every save
        if status.rank != 0:
            return None
        row = loop.log.current_row
        if NAN_DETECTED in row:
            logger.warning("not saving a checkpoint: %s is not finite", row[NAN_DETECTED])
            return None
        counters = _counters(status)
        if counters == self._last_counters:
            return self.last_saved
        sequence, path = self._run_directory.new_folder(status.epochs_done, status.iterations_done)
        self._write(path, sequence, CHECKPOINT_SAVED_TO, rank_states)
        logger.info("checkpoint saved to %s", path)
        self._run_directory.prune(loop.run_id, self.keep_last)
        return path

    def _write(
        self,
        path: str,
        sequence: Optional[int],
        record: Optional[str],
        rank_states: Optional[List[Dict[str, Any]]],
    ) -> None:
        """Write the loop's state (and every worker's own: ``rank_states``) to ``path``.

        The row's ``record`` holds ``path`` in the saved log, and stays in the
        live log only when the write succeeded.
        """
        loop = self.main_loop
        status = loop.status
        row = loop.log.current_row
        previous = row.get(record, MISSING) if record else MISSING
        saved_state = (self.sequence, self.last_saved, self._last_counters)
        if record:
            row[record] = path
            self.sequence, self.last_saved = sequence or self.sequence, path
            self._last_counters = _counters(status)
        seed = mxnet_seed(status)
        try:
            state = loop.state_dict()
            state["mxnet_seed"] = seed
            if rank_states is not None:
                state["rank_states"] = rank_states
            arg, aux = loop.get_params()
            write_checkpoint(
                path,
                loop.symbol,
                *(arg, aux, state, loop.optimizer_states()),
                run_id=loop.run_id,
                sequence=sequence,
                gradients=loop.pending_gradients(),
                extra_files=loop.checkpoint_files(arg, aux),
            )
        except BaseException:
            if record:
                self.sequence, self.last_saved, self._last_counters = saved_state
                if previous is MISSING:
                    loop.log.remove_record(status.iterations_done, record)
                else:
                    row[record] = previous
            raise
        mx.random.seed(seed)

    def _note_best(self) -> bool:
        """Take a new value of ``save_best_of``; True (and the row marked) when it improved."""
        if self._best_reader is None:
            return False
        log = self.main_loop.log
        value = self._best_reader.read(log)
        if value is MISSING:
            return False
        if not self.best.update(to_float(value, self.save_best_of), log.status.iterations_done):
            return False
        log.current_row[self.save_best_of + BEST_CHECKPOINT] = self.best.value
        return True

    def _save_best(self) -> None:
        rank_states = self._points.gather(self.main_loop)
        if self.main_loop.status.rank != 0:
            return
        path = os.path.join(self.directory, BEST)
        self._write(path, None, None, rank_states)
        logger.info("best %s = %g: saved to %s", self.save_best_of, self.best.value, path)

    # ---------------------------------------------------------------- state
    def state_dict(self) -> Dict[str, Any]:
        """Return the sequence number, the best value, the last save and its counters.

        The row last checked for ``save_best_of`` is part of it too.
        """
        reader = self._best_reader
        return {
            "sequence": self.sequence,
            "best": self.best.state_dict(),
            "best_checked_iteration": None if reader is None else reader.checked_iteration,
            "last_saved": self.last_saved,
            "last_counters": self._last_counters,
        }

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned (or a checkpoint of mxoid 0.1 holds)."""
        self.sequence = state["sequence"]
        if "best" in state:
            self.best.load_state_dict(state["best"])
        else:  # checkpoints of mxoid 0.1
            self.best.value = state.get("best_value")
        if self._best_reader is not None:
            self._best_reader.checked_iteration = state.get("best_checked_iteration")
        self.last_saved = state["last_saved"]
        self._last_counters = state["last_counters"]
