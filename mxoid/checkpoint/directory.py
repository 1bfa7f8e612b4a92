"""A directory of checkpoints, and what ``resume_from`` names.

The checkpoints of a directory in order, the lock of the run writing them,
and tidying up after interrupted writes; :class:`RunDirectory` puts these
together for the run that writes into a directory (the ``Checkpoint``
extension): locked, tidied, refused when it holds another run's checkpoints,
pruned of this run's older ones only.

What ``resume_from`` accepts (:func:`find_checkpoint`)
------------------------------------------------------
- A directory of checkpoints (what ``Checkpoint(directory)`` writes): the
  newest whole checkpoint in it, by order of writing. Damaged ones are
  skipped with a warning; when every checkpoint is damaged it is an error.
  A directory holding no checkpoint at all (or not yet existing, when it is
  the directory of one of the loop's own ``Checkpoint`` extensions) starts
  a new run, with a warning.
- One checkpoint folder (``.../checkpoint-000012-epoch0003-batch00000120``,
  or ``.../best``): exactly that checkpoint; damage is an error.

Anything else (a path that does not exist, a file) is an error.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import socket
import warnings
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, TypeVar

from .format import (
    CANNOT_WRITE,
    FOLDER_NAME,
    LOOP_STATE,
    MANIFEST,
    PREFIX,
    TEMPORARY_NAME,
    CheckpointContents,
    CheckpointError,
    CheckpointVanished,
    checkpoint_name,
    fix_for,
    unique_token,
)
from .reading import read_checkpoint, read_manifest

__all__ = [
    "DirectoryLock",
    "RunDirectory",
    "clean_temporaries",
    "find_checkpoint",
    "is_checkpoint_folder",
    "latest_checkpoint",
    "list_checkpoints",
    "newest_whole",
    "next_sequence",
    "other_runs",
    "remove_checkpoint",
    "run_of",
]

T = TypeVar("T")

logger = logging.getLogger(__name__)

LOCK = ".mxoid-lock"
LOCKED = (
    "checkpoint directory {directory} is in use by another run ({holder}); two runs "
    "writing into one directory would overwrite and prune each other's checkpoints. Give "
    "this run another directory, or stop the other one"
)
NO_CHECKPOINT_YET = (
    "resume_from={path!r} holds no whole checkpoint yet (no checkpoint at all): "
    "training starts from scratch"
)
NOT_FOUND = (
    "resume_from={path!r} does not exist. To resume, give the directory a Checkpoint "
    "extension wrote into (or one checkpoint folder inside it); to start a new run, "
    "give no resume_from, or the directory of this loop's own Checkpoint"
)
OTHER_RUN = (
    "checkpoint directory {directory} already holds checkpoints of another run (newest: "
    "{newest}). A new run there would prune them, and a later resume_from={directory!r} could "
    "continue the wrong run. Resume that run with MainLoop(..., resume_from={directory!r}), "
    "give this run another directory, or pass Checkpoint(..., require_empty=False) to write "
    "beside them (this run then never deletes them)"
)
DAMAGED_LEFT = (
    "{error}. It is left in place: resumption skips it and this run never deletes it "
    "(remove it once it is of no use)"
)
ALL_DAMAGED = (
    "every checkpoint in {path} is damaged, so there is nothing to resume from:\n"
    "{errors}\nRepair or remove them to start over there, or resume from another "
    "directory"
)


def list_checkpoints(directory: str) -> List[str]:
    """Return the checkpoint folders in ``directory``, oldest first.

    The folders are those renamed into place, maybe damaged; the order is by
    sequence number, which is the order they were written.
    """
    if not os.path.isdir(directory):
        return []
    found = []
    for name in os.listdir(directory):
        match = FOLDER_NAME.match(name)
        if match and os.path.isdir(os.path.join(directory, name)):
            found.append((int(match.group(1)), os.path.join(directory, name)))
    return [path for _, path in sorted(found)]


def next_sequence(directory: str) -> int:
    """Return the sequence number of the next checkpoint written into ``directory``."""
    numbers = [
        int(FOLDER_NAME.match(os.path.basename(p)).group(1)) for p in list_checkpoints(directory)
    ]
    return max(numbers, default=0) + 1


def run_of(path: str) -> Optional[str]:
    """Return the run that wrote the checkpoint folder ``path``; None when it cannot tell."""
    try:
        return read_manifest(path).get("run_id")
    except CheckpointError:
        return None


def other_runs(directory: str, run_id: str, best: str) -> Tuple[List[str], List[CheckpointError]]:
    """Return the checkpoint folders of ``directory`` (and its ``best``) another run wrote.

    Also returns the errors of the folders whose manifest cannot be read
    (missing, truncated: a write or a copy cut short): they belong to no run
    that can be told, so resumption skips them and pruning never deletes them.
    """
    folders = list_checkpoints(directory)
    if os.path.isdir(os.path.join(directory, best)):
        folders.append(os.path.join(directory, best))
    others, damaged = [], []
    for path in folders:
        try:
            run = read_manifest(path).get("run_id")
        except CheckpointError as error:
            damaged.append(error)
            continue
        if run != run_id:
            others.append(path)
    return others, damaged


def is_checkpoint_folder(path: str) -> bool:
    """Return True for a folder that is (or was meant to be) one checkpoint.

    Such a folder, rather than a directory of checkpoints, has a manifest or
    MXNet's files.
    """
    return os.path.isdir(path) and any(
        os.path.exists(os.path.join(path, name))
        for name in (MANIFEST, LOOP_STATE, f"{PREFIX}-symbol.json")
    )


def newest_whole(
    directory: str,
    read: Callable[[str], T],
    folders: Callable[[List[str]], List[str]] = lambda found: found,
) -> Tuple[Optional[T], Dict[str, CheckpointError]]:
    """Return ``read(folder)`` of the newest checkpoint folder it succeeds on, and the damaged ones.

    ``read`` raises :class:`CheckpointError` for a damaged folder: the next
    older one is tried. A folder removed while it is read
    (:class:`CheckpointVanished`: the run writing into the directory pruned
    it, so a newer one is there) sends the search back to the newest, listed
    anew. ``folders`` picks among the listed folders (oldest first).

    Returns
    -------
    result : T or None
        None when no folder could be read.
    damaged : dict of str to CheckpointError
        Each damaged folder's error, in the order met.
    """
    damaged: Dict[str, CheckpointError] = {}
    for _ in range(_RELISTS):
        for folder in reversed(folders(list_checkpoints(directory))):
            if folder in damaged:
                continue
            try:
                return read(folder), damaged
            except CheckpointVanished:
                break  # list again: a newer checkpoint replaced it
            except CheckpointError as error:
                damaged[folder] = error
        else:
            return None, damaged
    raise CheckpointError(
        f"the checkpoints of {directory} were removed faster than they could be read "
        f"({_RELISTS} times): the run writing there prunes them (keep_last) as fast as it "
        "saves. Resume from a copy of one checkpoint folder, or after that run ends"
    )


_RELISTS = 10


def latest_checkpoint(
    directory: str, *, check_finite: bool = False
) -> Optional[CheckpointContents]:
    """Return the newest whole checkpoint in ``directory``, or None if there is none.

    Damaged or incomplete checkpoints are skipped with a warning naming the
    file; one pruned while it is read gives the newest whole one again.
    """
    contents, damaged = newest_whole(
        directory, lambda folder: read_checkpoint(folder, check_finite=check_finite)
    )
    for error in damaged.values():
        warnings.warn(f"skipping a damaged checkpoint: {error}", stacklevel=2)
    return contents


# ------------------------------------------------------------ deleting, cleaning
def remove_checkpoint(path: str) -> None:
    """Delete a checkpoint folder: rename it away first, so no half-deleted one is ever listed."""
    parent, name = os.path.split(os.path.abspath(path))
    doomed = os.path.join(parent, f".deleting-{name}-{unique_token()}")
    os.rename(path, doomed)
    shutil.rmtree(doomed, ignore_errors=True)


def clean_temporaries(directory: str) -> List[Tuple[str, str]]:
    """Tidy what interrupted writes left in ``directory``.

    Call it holding the directory's :class:`DirectoryLock`.
    Half-written (``.tmp-``) and half-deleted (``.deleting-``) folders are
    deleted. A retired folder (``.retired-``, a whole checkpoint being
    replaced) is put back when nothing replaced it, deleted otherwise.
    Returns ``(path, what was done)`` pairs.
    """
    done: List[Tuple[str, str]] = []
    if not os.path.isdir(directory):
        return done
    for name in sorted(os.listdir(directory)):
        match = TEMPORARY_NAME.match(name)
        if not match:
            continue
        path = os.path.join(directory, name)
        kind, target = match.group(1), os.path.join(directory, match.group(2))
        if kind == "retired" and not os.path.lexists(target):
            os.rename(path, target)
            done.append((target, "restored (a replacement was interrupted)"))
            continue
        shutil.rmtree(path, ignore_errors=True)
        done.append((path, "removed (left half-written by an interrupted run)"))
    return done


class DirectoryLock:
    """An exclusive lock on a checkpoint directory, held while a run writes into it.

    The lock is ``fcntl.flock`` on ``<directory>/.mxoid-lock``: the operating
    system releases it when the process ends in any way (a SIGKILL included),
    so a lock is never left stale, whatever the PID of the process (1 in a
    container). The file says who holds it.

    Raises
    ------
    CheckpointError
        From :meth:`acquire`, when another process holds the lock or the
        directory cannot be written.
    """

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.path = os.path.join(directory, LOCK)
        self._descriptor: Optional[int] = None

    @property
    def held(self) -> bool:
        """Whether this object holds the lock."""
        return self._descriptor is not None

    def acquire(self) -> None:
        """Take the lock, and write who holds it into the lock file.

        The directory is created if needed, and checked to be writable.
        Nothing happens when this object already holds the lock.
        """
        if self.held:
            return
        try:
            os.makedirs(self.directory, exist_ok=True)
            descriptor = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as error:
            raise self._unwritable(error) from None
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(descriptor, 4096, 0).decode(errors="replace").strip() or "unknown"
            os.close(descriptor)
            raise CheckpointError(LOCKED.format(directory=self.directory, holder=holder)) from None
        try:
            about = json.dumps({"pid": os.getpid(), "host": socket.gethostname()})
            os.ftruncate(descriptor, 0)
            os.pwrite(descriptor, about.encode(), 0)
            probe = os.path.join(self.directory, f".tmp-probe-{unique_token()}")
            os.makedirs(probe)
            os.rmdir(probe)
        except OSError as error:
            os.close(descriptor)
            raise self._unwritable(error) from None
        self._descriptor = descriptor

    def _unwritable(self, error: OSError) -> CheckpointError:
        return CheckpointError(
            CANNOT_WRITE.format(
                path=self.directory,
                cause=f"{error.strerror} ({error.filename or self.path})",
                fix=fix_for(error, "make it writable, or point Checkpoint at another folder"),
            )
        )

    def release(self) -> None:
        """Release the lock, if held."""
        if self._descriptor is not None:
            os.close(self._descriptor)
            self._descriptor = None


class RunDirectory:
    """The directory of checkpoints one run writes into, from its start to its end.

    :meth:`open` takes the directory's :class:`DirectoryLock` (created if
    needed and checked to be writable: an unwritable directory is reported
    when training starts, not at the first save; a second process writing
    into it gets a clear error), tidies what interrupted writes left
    (:func:`clean_temporaries`) and, with ``require_empty``, refuses a
    directory holding checkpoints of another run (``best`` included); without
    it the run writes beside them and never deletes them. A
    folder whose manifest cannot be read belongs to no run that can be told:
    it is left in place, with a warning. :meth:`close` releases the lock.
    :meth:`new_folder` names the next checkpoint, and :meth:`prune` deletes
    only the given run's older checkpoints.

    Parameters
    ----------
    path : str
        The directory.
    best : str, default 'best'
        The folder of the best checkpoint, beside the numbered ones.
    log : logging.Logger, optional
        Where what was tidied and the damaged folders left are told, as
        warnings; this module's logger by default.

    Raises
    ------
    CheckpointError
        From :meth:`open`: the lock is held elsewhere, the directory cannot be
        written, or it holds another run's checkpoints (the lock is released).
    """

    def __init__(
        self,
        path: str,
        best: str = "best",
        log: Optional[logging.Logger] = None,
    ) -> None:
        self.path = path
        self.best = best
        self.lock = DirectoryLock(path)
        self._log = log or logger

    def open(self, run_id: str, require_empty: bool = True) -> None:
        """Lock the directory and tidy it; refuse it if it holds another run's checkpoints.

        Another run's checkpoints are refused only with ``require_empty``.
        """
        self.lock.acquire()
        try:
            for path, what in clean_temporaries(self.path):
                self._log.warning("%s %s", path, what)
            if require_empty:  # a folder whose manifest cannot be read is left, with a warning
                others, damaged = other_runs(self.path, run_id, self.best)
                for error in damaged:
                    self._log.warning(DAMAGED_LEFT.format(error=error))
                if others:
                    raise CheckpointError(OTHER_RUN.format(directory=self.path, newest=others[-1]))
        except BaseException:
            self.lock.release()
            raise

    def close(self) -> None:
        """Release the directory's lock, if held."""
        self.lock.release()

    def new_folder(self, epochs_done: int, iterations_done: int) -> Tuple[int, str]:
        """Return the sequence number and the path of the next checkpoint folder."""
        sequence = next_sequence(self.path)
        return sequence, os.path.join(
            self.path, checkpoint_name(sequence, epochs_done, iterations_done)
        )

    def prune(self, run_id: str, keep_last: Optional[int]) -> None:
        """Delete the checkpoints of ``run_id`` but its newest ``keep_last`` (None keeps all).

        Another run's checkpoints, ``best`` and folders whose run cannot be
        told are never deleted.
        """
        if keep_last is None:
            return
        mine = [path for path in list_checkpoints(self.path) if run_of(path) == run_id]
        for path in mine[:-keep_last]:
            remove_checkpoint(path)


def find_checkpoint(
    resume_from: Optional[os.PathLike[str] | str],
    own_directories: Sequence[str] = (),
    check: Any = None,
) -> Optional[CheckpointContents]:
    """Return the checkpoint ``resume_from`` names, under the rules of this module's documentation.

    Parameters
    ----------
    resume_from : str or path-like or None
    own_directories : sequence of str
        The directories of the loop's Checkpoint extensions: one of them may
        not exist yet (a first run).
    check : callable, optional
        ``check(contents)`` raises :class:`CheckpointError` when a whole
        checkpoint lacks something this loop needs (a damaged one: an earlier
        checkpoint is tried) or :class:`ResumeError` when it belongs to another
        training (never retried).

    Raises
    ------
    CheckpointError, ResumeError, ValueError
    """
    if resume_from is None:
        return None
    path = os.path.abspath(os.fspath(resume_from))
    check = check or (lambda contents: None)
    if is_checkpoint_folder(path):
        contents = read_checkpoint(path, check_finite=True)
        check(contents)
        return contents
    if not os.path.exists(path):
        if path in {os.path.abspath(d) for d in own_directories}:
            warnings.warn(NO_CHECKPOINT_YET.format(path=os.fspath(resume_from)), stacklevel=5)
            return None
        raise ValueError(NOT_FOUND.format(path=os.fspath(resume_from)))
    if not os.path.isdir(path):
        raise ValueError(
            f"resume_from={os.fspath(resume_from)!r} is a file, not a checkpoint "
            "directory or folder"
        )
    if not list_checkpoints(path):
        warnings.warn(NO_CHECKPOINT_YET.format(path=os.fspath(resume_from)), stacklevel=5)
        return None

    def read_and_check(folder: str) -> CheckpointContents:
        contents = read_checkpoint(folder, check_finite=True)
        check(contents)
        return contents

    damaged: Dict[str, CheckpointError] = {}
    try:
        contents, damaged = newest_whole(path, read_and_check)
    finally:  # a ResumeError of an older checkpoint comes after the newer ones' damage
        for error in damaged.values():
            warnings.warn(f"skipping a damaged checkpoint: {error}", stacklevel=5)
    if contents is None:
        errors = "\n".join(f"- {error}" for error in damaged.values())
        raise CheckpointError(ALL_DAMAGED.format(path=path, errors=errors))
    return contents
