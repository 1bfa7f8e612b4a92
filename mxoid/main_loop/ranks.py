"""Each worker's own part of a checkpoint, in distributed training.

Rank 0 writes the checkpoints, but every worker has random states and a
training iterator position of its own (its shard, its shuffle). At every save
each worker's part (:func:`own_state`) is gathered to rank 0
(:func:`gather_rank_states`, a collective exchange) and stored in ``loop.json``
as ``rank_states``, one entry per rank; on resumption every worker reads the
one checkpoint and takes its own entry (:func:`rank_entry`). Where a resumption
cannot be exact (``dist_async``), rank 0 says so once (:func:`warn_inexact`);
the servers' optimizer states of ``dist_sync`` are given back by
:mod:`.server_optimizer`, which warns with :data:`SERVER_STATES_RESTART` when
it cannot. A job of another number of workers (:func:`saved_workers` differs)
takes no entry: :mod:`.resizing` derives each worker's part anew.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any, Dict, List, Optional

from ..checkpoint.format import CheckpointError, ResumeError
from ..checkpoint.random_state import get_random_states
from ..distributed.servers import is_asynchronous, is_distributed
from ..distributed.workers import allgather_json

if TYPE_CHECKING:  # pragma: no cover
    from .loop import MainLoop

__all__ = [
    "ASYNC_RESUMPTION",
    "SERVER_STATES_RESTART",
    "gather_rank_states",
    "own_state",
    "rank_entry",
    "saved_workers",
    "warn_inexact",
]

RANK_STATES = "rank_states"
SERVER_STATES_RESTART = (
    "resuming from {path} with the optimizer on the parameter servers "
    "(update_on_kvstore=True, the default of a dist kvstore): {why}, so the servers' "
    "optimizer states (momentum, Adam's moments, update counts) restart from zero, and "
    "training does not continue exactly.{fix} With dist_sync and MainLoop(..., "
    "update_on_kvstore=False) the workers run the optimizer, and checkpoints hold its "
    "states whatever the servers"
)
ASYNC_RESUMPTION = (
    "resuming from {path} with dist_async: the parameters, every worker's iterator position "
    "and random states, the log and the extensions' states are restored, but the optimizer "
    "states lived on the servers and restart from zero (the servers apply each push as it "
    "arrives, so their states at a save do not belong to the parameters saved, and are not "
    "saved), and the order in which the servers applied the workers' pushes is not "
    "reproducible: training continues, not exactly as without the interruption"
)
ONLY_RANK_ZERO = (
    "checkpoint {path} holds rank 0's random states and iterator position only (it was "
    "written by an earlier mxoid): the other ranks continue from rank 0's"
)


def own_state(loop: MainLoop, mxnet_seed: int) -> Dict[str, Any]:
    """Return this worker's own part of a checkpoint: random states, iterator position, seed.

    ``mxnet_seed`` is the seed it gives MXNet at this save.
    """
    return {
        "random": get_random_states(),
        "data_position": loop.data_position.state_dict(),
        "mxnet_seed": mxnet_seed,
    }


def gather_rank_states(loop: MainLoop, mxnet_seed: int) -> Optional[List[Dict[str, Any]]]:
    """Return every worker's :func:`own_state`, in rank order; None without a dist kvstore.

    A collective call: every worker must make it at the same batch.
    """
    if not is_distributed(loop.kvstore):
        return None
    return allgather_json(loop.kvstore, "rank_states", own_state(loop, mxnet_seed))


def saved_workers(state: Dict[str, Any]) -> int:
    """Return the number of workers of the job that saved the loop state ``state``.

    One entry of ``rank_states`` per worker; a checkpoint without them (one
    process, or an earlier mxoid) says it in its status.
    """
    entries = state.get(RANK_STATES)
    if isinstance(entries, list):
        return len(entries)
    return int((state.get("status") or {}).get("num_workers", 1))


def rank_entry(state: Dict[str, Any], rank: int, num_workers: int, where: str) -> Dict[str, Any]:
    """Return worker ``rank``'s own part of the loop state ``state`` (of checkpoint ``where``).

    A checkpoint without ``rank_states`` (one process, or an earlier mxoid)
    gives every rank the loop state's own.

    Raises
    ------
    ResumeError
        When the checkpoint was saved by another number of workers.
    CheckpointError
        When its ``rank_states`` are not one entry per worker.
    """
    entries = state.get(RANK_STATES)
    if entries is None:
        return {
            "random": state["random"],
            "data_position": state["data_position"],
            "mxnet_seed": state.get("mxnet_seed"),
        }
    if not isinstance(entries, list) or not all(
        isinstance(e, dict) and {"random", "data_position"} <= set(e) for e in entries
    ):
        raise CheckpointError(f"checkpoint {where} is damaged: its loop.json's {RANK_STATES}")
    if len(entries) != num_workers:
        raise ResumeError(
            f"checkpoint {where} was saved by {len(entries)} workers, this job has "
            f"{num_workers}, and each worker's own part is only that of the same number "
            "(mxoid.main_loop.resizing derives them anew for another)"
        )
    return entries[rank]


def warn_inexact(loop: MainLoop, state: Dict[str, Any], where: str, stacklevel: int) -> None:
    """On rank 0 of a distributed job: warn once of what the resumption cannot restore."""
    kvstore = loop.kvstore
    if not is_distributed(kvstore) or kvstore.rank != 0:
        return
    if is_asynchronous(kvstore):
        warnings.warn(ASYNC_RESUMPTION.format(path=where), stacklevel=stacklevel + 1)
        return
    resized = saved_workers(state) != kvstore.num_workers  # .resizing warns of it
    if state.get(RANK_STATES) is None and kvstore.num_workers > 1 and not resized:
        warnings.warn(ONLY_RANK_ZERO.format(path=where), stacklevel=stacklevel + 1)
