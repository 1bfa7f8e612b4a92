"""The parameter servers' optimizer states in a loop's checkpoints: saved, and given back.

With ``dist_sync`` and the optimizer on the servers (``update_on_kvstore``, a
dist kvstore's default), rank 0 fetches every server's optimizer and states
at each save (:func:`server_states_file`: a file of the checkpoint,
``servers-optimizer.states``), and a resumption gives each server its own
back (:func:`give_back_server_states`), so that a resumed job continues
exactly. How they travel: :mod:`mxoid.distributed.server_states`.

Not with ``dist_async``: there each push is applied as it arrives, so
states fetched at a save would not belong to the parameters saved, and the
resumption is not exact anyway (:func:`~mxoid.main_loop.ranks.warn_inexact`).
"""

from __future__ import annotations

import os
import pickle
import warnings
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional

import mxnet as mx

from ..checkpoint.format import (
    SERVER_STATES,
    CheckpointContents,
    CheckpointError,
    ResumeError,
    unique_token,
)
from ..distributed.server_states import (
    ServerStatesError,
    fetch_server_states,
    restore_server_states,
    server_layout,
)
from ..distributed.servers import is_asynchronous, is_distributed
from .ranks import SERVER_STATES_RESTART

if TYPE_CHECKING:  # pragma: no cover
    from .loop import MainLoop

__all__ = [
    "give_back_server_states",
    "server_states_file",
    "states_saved_by_servers",
    "write_server_states",
]

NONE_SAVED = "the checkpoint holds none of the servers' states (an earlier mxoid wrote it)"
OTHER_LAYOUT = (
    "the checkpoint's states were held by {saved[num_servers]} server(s) splitting arrays "
    "over {saved[bigarray_bound]} values (MXNET_KVSTORE_BIGARRAY_BOUND), this job has "
    "{here[num_servers]} and {here[bigarray_bound]}, and a server's states fit only the "
    "key range it held"
)
SAME_LAYOUT = (
    " Resume with {saved[num_servers]} server(s) (mxoid launch -s {saved[num_servers]}) and "
    "MXNET_KVSTORE_BIGARRAY_BOUND={saved[bigarray_bound]} for an exact continuation."
)


def states_saved_by_servers(loop: MainLoop) -> bool:
    """Return True where checkpoints hold the servers' states (``dist_sync``, updating)."""
    kvstore = loop.kvstore
    return is_distributed(kvstore) and loop.update_on_kvstore and not is_asynchronous(kvstore)


def server_states_file(loop: MainLoop) -> Dict[str, Callable[[str], None]]:
    """Return the checkpoint file of the servers' states, by name, with its writer (rank 0).

    None saved (an empty dict) unless :func:`states_saved_by_servers`. The
    writer asks the servers for their states (they write them in a folder
    beside the file, in the checkpoint's temporary folder, removed once read).
    """
    if not states_saved_by_servers(loop):
        return {}
    return {SERVER_STATES: lambda path: write_server_states(loop.kvstore, path)}


def write_server_states(kvstore: mx.kv.KVStore, path: str) -> None:
    """Write every server's states, with their layout, to ``path`` (rank 0).

    The servers write into a folder beside ``path`` (in a checkpoint's
    temporary folder), removed once read.

    Raises
    ------
    CheckpointError
        When a server did not write its states.
    """
    folder = os.path.join(os.path.dirname(os.path.abspath(path)), f".servers-{unique_token()}")
    try:
        dumps = fetch_server_states(kvstore, folder)
    except ServerStatesError as error:
        raise CheckpointError(f"cannot write checkpoint file {path}: {error}") from None
    with open(path, "wb") as handle:
        pickle.dump({"layout": server_layout(), "servers": dumps}, handle, protocol=4)


def give_back_server_states(
    loop: MainLoop,
    checkpoint: CheckpointContents,
    policy: Callable[[mx.optimizer.Optimizer], List[str]],
    stacklevel: int,
) -> None:
    """Give the servers the states ``checkpoint`` holds; a collective call on every worker.

    Only where :func:`states_saved_by_servers`. Rank 0 applies the resume
    ``policy`` (it changes a saved optimizer, returns the changes) to each
    server's optimizer and warns of each change once, or warns that the
    states restart (none saved, or another layout of the servers); then
    :func:`~mxoid.distributed.server_states.restore_server_states`.

    Raises
    ------
    ResumeError
        When the servers did not load their states.
    """
    if not states_saved_by_servers(loop):
        return
    kvstore = loop.kvstore
    dumps = None
    if kvstore.rank == 0:
        dumps = _dumps_to_load(checkpoint, policy, kvstore.num_workers, stacklevel + 1)
    parent = os.path.dirname(os.path.abspath(checkpoint.path))
    folder = os.path.join(parent, f".tmp-server-states-{unique_token()}")
    try:
        restore_server_states(kvstore, dumps, folder)
    except (ServerStatesError, OSError) as error:
        raise ResumeError(f"cannot resume from {checkpoint.path}: {error}") from None


def _dumps_to_load(
    checkpoint: CheckpointContents,
    policy: Callable[[mx.optimizer.Optimizer], List[str]],
    num_workers: int,
    stacklevel: int,
) -> Optional[List[bytes]]:
    """Return each server's dump with the resume policy applied; None (warned) when none fit.

    Each server's update rule gets this job's ``num_workers`` (the rows of a
    reduction key): a job may resume with another number than the checkpoint's.
    """
    saved: Optional[Dict[str, Any]] = checkpoint.server_states
    here = server_layout()
    why = fix = None
    if saved is None:
        why, fix = NONE_SAVED, ""
    elif saved["layout"] != here:
        why = OTHER_LAYOUT.format(saved=saved["layout"], here=here)
        fix = SAME_LAYOUT.format(saved=saved["layout"])
    if why is not None:
        warning = SERVER_STATES_RESTART.format(path=checkpoint.path, why=why, fix=fix)
        warnings.warn(warning, stacklevel=stacklevel + 1)
        return None
    dumps, changes = [], []
    for dump in saved["servers"]:
        states, server_optimizer = pickle.loads(dump)
        changes = policy(server_optimizer.optimizer)  # the same changes on every server
        server_optimizer.num_workers = num_workers
        dumps.append(pickle.dumps((states, server_optimizer)))
    for change in changes:
        warnings.warn(f"resuming from {checkpoint.path} with {change}", stacklevel=stacklevel + 1)
    return dumps
