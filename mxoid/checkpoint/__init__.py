"""Checkpoints on disk: the folder format, directories of them, loading what they hold.

- :mod:`.format`: one checkpoint folder, written atomically;
- :mod:`.reading`: one checkpoint folder read and verified;
- :mod:`.directory`: a directory of checkpoints: their order, the lock of the run
  writing them, tidying after interrupted writes (together, for that run:
  :class:`RunDirectory`), and what ``resume_from`` names;
- :mod:`.random_state`: NumPy's and Python's random states as plain data;
- :mod:`.loading`: models and parameters from mxoid's and MXNet's files.

The :class:`~mxoid.extensions.Checkpoint` extension writes checkpoints; what
the loop puts in them, and how a checkpoint resumes it, is the loop's own
(:mod:`mxoid.main_loop.state`, :mod:`mxoid.main_loop.resumption`).
"""

from .directory import (
    DirectoryLock,
    RunDirectory,
    clean_temporaries,
    find_checkpoint,
    is_checkpoint_folder,
    latest_checkpoint,
    list_checkpoints,
    next_sequence,
    remove_checkpoint,
)
from .format import (
    FORMAT_VERSION,
    LOOP_STATE_KEYS,
    CheckpointContents,
    CheckpointError,
    ResumeError,
    checkpoint_name,
    write_checkpoint,
)
from .reading import read_checkpoint, read_manifest

__all__ = [
    "FORMAT_VERSION",
    "LOOP_STATE_KEYS",
    "CheckpointContents",
    "CheckpointError",
    "DirectoryLock",
    "ResumeError",
    "RunDirectory",
    "checkpoint_name",
    "clean_temporaries",
    "find_checkpoint",
    "is_checkpoint_folder",
    "latest_checkpoint",
    "list_checkpoints",
    "next_sequence",
    "read_checkpoint",
    "read_manifest",
    "remove_checkpoint",
    "write_checkpoint",
]
