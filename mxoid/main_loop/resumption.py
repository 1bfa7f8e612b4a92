"""Which checkpoint resumes a loop: the same training, and nothing of it missing.

:func:`choose_checkpoint` is what ``MainLoop(resume_from=...)`` does:
:func:`~mxoid.checkpoint.find_checkpoint` considers the checkpoints newest
first and asks :func:`check_resumable` of each: a :class:`ResumeError` stops
the search (the checkpoint is of another training), a
:class:`CheckpointError` moves on to an earlier one.
"""

from __future__ import annotations

import os
from typing import Callable, Dict, Optional, Sequence

import mxnet as mx

from ..checkpoint import find_checkpoint
from ..checkpoint.format import CheckpointContents, CheckpointError, ResumeError
from ..checkpoint.renaming import rename_parameters
from ..data.position import DataPosition
from ..executor_manager import DataParallelExecutorManager
from ..executor_manager.initialization import parameter_shapes, shape_differences
from .ranks import rank_entry, saved_workers

__all__ = ["check_resumable", "choose_checkpoint"]


def choose_checkpoint(
    resume_from: Optional[os.PathLike[str] | str],
    own_directories: Sequence[str],
    symbol: mx.sym.Symbol,
    manager: DataParallelExecutorManager,
    data_position: DataPosition,
    *,
    update_on_kvstore: bool,
    accumulate_batches: int,
    states_on_servers: bool,
    rank: int = 0,
    num_workers: int = 1,
    names: Optional[Callable[[CheckpointContents], Dict[str, str]]] = None,
) -> Optional[CheckpointContents]:
    """Return the checkpoint ``resume_from`` names that can resume this loop (None: start anew).

    ``own_directories`` are the checkpoint directories of the loop's
    extensions (:attr:`~mxoid.Extension.checkpoint_directory`): one of them
    may not exist yet, in a first run. What ``resume_from`` accepts is in
    :mod:`mxoid.checkpoint.directory`; what must match, in :func:`check_resumable`.
    ``names``: the network's :meth:`~mxoid.network.Network.checkpoint_names`;
    each checkpoint considered is renamed by it first (:func:`rename_parameters`).
    """

    def check(contents: CheckpointContents) -> None:
        if names is not None:
            rename_parameters(contents, names(contents))
        check_resumable(
            contents,
            symbol,
            manager,
            data_position,
            update_on_kvstore=update_on_kvstore,
            accumulate_batches=accumulate_batches,
            states_on_servers=states_on_servers,
            rank=rank,
            num_workers=num_workers,
        )

    return find_checkpoint(resume_from, own_directories, check)


def check_resumable(
    contents: CheckpointContents,
    symbol: mx.sym.Symbol,
    manager: DataParallelExecutorManager,
    data_position: DataPosition,
    *,
    update_on_kvstore: bool,
    accumulate_batches: int,
    states_on_servers: bool,
    rank: int = 0,
    num_workers: int = 1,
) -> None:
    """Raise when ``contents`` cannot resume the loop training ``symbol`` on ``manager``.

    ``states_on_servers``: a distributed kvstore updates, so the checkpoint holds no
    optimizer states. ``rank`` of ``num_workers``: this worker's, whose own
    iterator position (:func:`~mxoid.main_loop.ranks.rank_entry`) is checked;
    a checkpoint of another number of workers resumes too
    (:mod:`~mxoid.main_loop.resizing`), its iterators' inputs checked.

    :class:`ResumeError` when it is of another training (the network,
    devices, where the optimizer runs, the batch size, the data);
    :class:`CheckpointError` when it lacks something its own network
    needs (it is damaged: an earlier checkpoint is tried).
    """
    where = contents.path
    inputs = {d.name: tuple(d.shape) for d in manager.data_descs + manager.label_descs}
    ours = parameter_shapes(symbol, inputs)
    try:
        theirs = parameter_shapes(mx.sym.load_json(contents.symbol_json), inputs)
    except mx.base.MXNetError:
        raise ResumeError(
            f"checkpoint {where} was saved from another network: its symbol "
            "does not take this loop's inputs. Resume with the network it was "
            "trained with, or start a new run from its parameters"
        ) from None
    if theirs != ours:
        raise ResumeError(
            f"checkpoint {where} was saved from another network ("
            f"{shape_differences({**ours[0], **ours[1]}, {**theirs[0], **theirs[1]})}"
            "). Resume with the network it was trained with, or start a new "
            "run from its parameters (MainLoop(..., arg_params=...))"
        )
    for kind, saved, expected in (
        ("parameter", contents.arg_params, ours[0]),
        ("auxiliary state", contents.aux_params, ours[1]),
    ):
        missing = sorted(set(expected) - set(saved))
        wrong = sorted(
            n for n in set(expected) & set(saved) if tuple(saved[n].shape) != expected[n]
        )
        if missing or wrong:
            raise CheckpointError(
                f"checkpoint {where} is damaged: its {kind}s {missing} "
                f"are missing, {wrong} have other shapes than its network's"
            )
    state = contents.loop_state
    for key, here in (
        ("num_devices", len(manager.contexts)),
        ("update_on_kvstore", update_on_kvstore),
        ("batch_size", manager.batch_size),
        ("accumulate_batches", accumulate_batches),
    ):
        if key in state and state[key] != here:
            raise ResumeError(
                f"checkpoint {where} was saved with {key}={state[key]}, this "
                f"loop has {key}={here}; exact resumption needs the same. "
                "Resume with the same setting, or start a new run from the "
                "checkpoint's parameters (MainLoop(..., arg_params=...))"
            )
    if contents.optimizer_states is None and not states_on_servers:
        raise CheckpointError(
            f"checkpoint {where} is damaged: it lacks optimizer.states "
            "(the momentum and update counts)"
        )
    saved = saved_workers(state)
    if saved == num_workers:
        data_position.check(rank_entry(state, rank, num_workers, where)["data_position"], where)
    else:  # another share of the same data (mxoid.main_loop.resizing): its inputs only
        position = rank_entry(state, 0, saved, where)["data_position"]
        data_position.check(position, where, resharded=True)
