"""A job resumed by another number of workers than the one that saved its checkpoint.

On a cluster a requeued job gets whatever nodes are free: more or fewer
workers than before. What a checkpoint holds of the training itself comes
back as for the same number -- the parameters, the optimizer states (the
workers' with ``update_on_kvstore=False``; the servers' when their number and
``MXNET_KVSTORE_BIGARRAY_BOUND`` are the same, :mod:`.server_optimizer`), the
log, the counters and the extensions' states -- but each worker's own part
(:mod:`.ranks`: its shard's position, its random states) belongs to a shard
and a rank of the old job. So, on every worker (:func:`resume_resized`):

- the data is the worker's share over the new number (the script's
  :func:`mxoid.shard`), and the epoch position is what the job had trained of
  the epoch over all its workers. The new shards hold other rows than the old
  ones, so an epoch cannot go on exactly from the middle: a checkpoint saved
  mid-epoch resumes at the next epoch boundary, the rest of that epoch skipped
  (:meth:`~mxoid.data.position.DataPosition.skip_epoch`); one saved at an
  epoch's end resumes at the next epoch's start, on the new shards;
- each worker's NumPy, Python and MXNet random states are seeded anew from
  the checkpoint's states and the worker's new rank (:func:`derived_seed`);
- the default ``rescale_grad`` (``1 / (accumulate_batches * batch_size *
  workers)``) follows the new number of workers (:func:`follow_worker_count`);
- every worker warns (:data:`RESIZED`) that the continuation is not the
  original job's, bit for bit, and why.
"""

from __future__ import annotations

import hashlib
import json
import random
import warnings
from typing import TYPE_CHECKING, Any, Dict, Mapping, Optional, Tuple

import mxnet as mx
import numpy as np

from ..checkpoint.format import CheckpointContents
from ..distributed.server_states import server_layout
from .ranks import RANK_STATES, saved_workers

if TYPE_CHECKING:  # pragma: no cover
    from .loop import MainLoop

__all__ = ["RESIZED", "derived_seed", "follow_worker_count", "resume_resized"]

RESIZED = (
    "resuming from {path}, saved by a job of {saved} worker(s), with {workers} worker(s): "
    "the continuation is not bit-identical to the original job. Carried over: the "
    "parameters, {states}, the log, the counters and the extensions' states. Not: the data "
    "is re-sharded (each worker reads its share of {workers}), each worker's random states "
    "are seeded anew from the checkpoint's and its rank, and the gradients' rescaling "
    "follows the number of workers ({rescale}). {position}"
)
MID_EPOCH = (
    "The checkpoint was saved {batches} batch(es) into epoch {epoch} ({samples} samples "
    "trained over {saved} worker(s)); the new shards hold other rows, so that epoch cannot "
    "continue exactly from there: the rest of epoch {epoch} is skipped, and training resumes "
    "with epoch {next}"
)
AT_BOUNDARY = "Training resumes with epoch {next}, on the new shards"
ON_WORKERS = "the optimizer states (every worker the same)"
ON_SERVERS = "the servers' optimizer states"
SERVERS_RESTART = "not the servers' optimizer states (they restart: see the warning about them)"


def derived_seed(state: Mapping[str, Any], rank: int, num_workers: int) -> int:
    """Return worker ``rank``'s new seed: from the checkpoint's random states and the rank.

    The same checkpoint, rank and number of workers give the same seed;
    another rank, another seed.
    """
    saved = state.get(RANK_STATES) or [{"random": state.get("random")}]
    text = json.dumps([entry.get("random") for entry in saved], sort_keys=True)
    digest = hashlib.sha256(f"{text}|{rank}|{num_workers}".encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


def follow_worker_count(
    state: Mapping[str, Any],
    started: Mapping[str, Any],
    settings: Mapping[str, Any],
    num_workers: int,
) -> Tuple[Mapping[str, Any], Optional[float]]:
    """Return the run's starting settings as the resume policy should see them, and the rescaling.

    With the default rescaling of the saved job (``1 / (accumulate_batches *
    batch_size * workers)``, ``started``) and this loop's (``settings``, of
    ``num_workers``), the loop's is no setting given anew but the same rule:
    the settings come back with it, and the rescaling to give the restored
    optimizer. Else (the same number, or a ``rescale_grad`` of one's own)
    ``started`` unchanged and None.
    """
    saved = saved_workers(state)
    here = settings.get("settings", {}).get("rescale_grad")
    if saved == num_workers or here is None:
        return started, None
    rows = state.get("accumulate_batches", 1) * state.get("batch_size", 0)
    if not rows or started.get("rescale_grad") != 1.0 / (rows * saved):
        return started, None
    if here != 1.0 / (rows * num_workers):
        return started, None
    return {**started, "rescale_grad": here}, here


def resume_resized(loop: MainLoop, checkpoint: CheckpointContents, stacklevel: int) -> None:
    """Give this worker its part of a job of another number of workers; warn (every worker).

    Called by :func:`~mxoid.main_loop.state.restore_loop_state` once the
    counters are back: seeds the random generators anew, puts the training
    iterator at the end of a started epoch.
    """
    state, status = checkpoint.loop_state, loop.status
    saved, workers = saved_workers(state), status.num_workers
    seed = derived_seed(state, status.rank, workers)
    np.random.seed(seed)
    random.seed(seed)
    mx.random.seed(seed)
    epoch = status.epochs_done + 1
    if status.epoch_started and status.iterations_done_in_epoch > 0:
        loop.data_position.skip_epoch()
        batches = status.iterations_done_in_epoch
        samples = batches * state.get("batch_size", loop.manager.batch_size) * saved
        position = MID_EPOCH.format(
            batches=batches, epoch=epoch, samples=samples, saved=saved, next=epoch + 1
        )
    else:
        position = AT_BOUNDARY.format(next=epoch)
    rescale = f"rescale_grad = {loop.update.optimizer.rescale_grad:.6g}"
    warnings.warn(
        RESIZED.format(
            path=checkpoint.path,
            saved=saved,
            workers=workers,
            states=_states_kept(loop, checkpoint),
            rescale=rescale,
            position=position,
        ),
        stacklevel=stacklevel + 1,
    )


def _states_kept(loop: MainLoop, checkpoint: CheckpointContents) -> str:
    """Say which optimizer states the resumption gives back."""
    if checkpoint.optimizer_states is not None:
        return ON_WORKERS
    saved: Optional[Dict[str, Any]] = checkpoint.server_states
    if saved is not None and saved["layout"] == server_layout():
        return ON_SERVERS
    return SERVERS_RESTART
