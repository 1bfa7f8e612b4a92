"""Checkpoints: the folder format, directories of them, and what exact resumption needs.

- :mod:`.format`: one checkpoint folder, written atomically and verified when read;
- :mod:`.directory`: a directory of checkpoints: their order, the lock of the run
  writing them, tidying after interrupted writes, and what ``resume_from`` names;
- :mod:`.data_position`: where the training iterator stands, to resume mid-epoch;
- :mod:`.random_state`: NumPy's and Python's random states as plain data;
- :mod:`.loop_state`: what a checkpoint holds of the loop itself, and how
  resumption gives it back.

The :class:`~mxoid.extensions.Checkpoint` extension writes checkpoints;
:meth:`mxoid.MainLoop.state_dict` and :meth:`~mxoid.MainLoop.load_state_dict`
(through :mod:`.loop_state`) say what the loop puts in them.
"""

from .directory import (
    DirectoryLock,
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
    read_checkpoint,
    read_manifest,
    write_checkpoint,
)

__all__ = [
    "FORMAT_VERSION",
    "LOOP_STATE_KEYS",
    "CheckpointContents",
    "CheckpointError",
    "DirectoryLock",
    "ResumeError",
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
