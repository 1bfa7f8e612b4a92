"""The parameter servers' optimizer states, fetched for a checkpoint and given back.

With ``dist_sync`` and the optimizer on the servers (``update_on_kvstore``, a
dist kvstore's default) the momentum, Adam's moments and the update counts
live in the server processes, and MXNet cannot save them
(``KVStore.save_optimizer_states`` refuses a dist kvstore, apache/mxnet #15923).
mxoid reaches them through the kvstore's command channel: command head 0
reaches a server's Python controller, which in MXNet only unpickles an
optimizer. The servers mxoid starts (:func:`~mxoid.distributed.run_server`)
run :class:`StatesServer`, whose controller also answers two commands of its
own, told apart from a pickled optimizer by their prefix; every other
command goes to MXNet's controller.

- :func:`fetch_server_states` (rank 0, at a save): every server writes its
  updater's dump (its states and its :class:`~mxoid.distributed.ServerOptimizer`)
  to ``server<rank>.states`` in a folder rank 0 names, and rank 0 reads them.
- :func:`restore_server_states` (every worker, on resumption, once the servers
  have this run's optimizer and every worker has passed the barrier after it):
  rank 0 writes each server's dump into a folder and every server loads its
  own (and removes it: a file left is a server that failed); then every
  worker meets at a barrier, so that no worker pushes before the states are
  back. Loaded before that barrier, MXNet's ``set_optimizer``
  of a worker would replace the updater and silently lose them.

Notes
-----
The servers hold the states by key range, a big array split across them
(``MXNET_KVSTORE_BIGARRAY_BOUND``); a server's dump fits only the server of
the same rank, with the same number of servers and the same bound
(:func:`server_layout`). A command returns once every server has run it; a
server that fails to run one says why on its standard error, and rank 0
finds its file missing. The folder must be one the servers see at the same
path: the checkpoint directory, on a file system every host shares.
"""

from __future__ import annotations

import os
import shutil
import sys
from typing import Dict, List, Optional

import mxnet as mx

__all__ = [
    "ServerStatesError",
    "StatesServer",
    "fetch_server_states",
    "restore_server_states",
    "server_layout",
]

SAVE = b"mxoid-save-optimizer-states:"
LOAD = b"mxoid-load-optimizer-states:"
CONTROLLER_HEAD = 0  # the only head ps-lite hands to a server's Python controller
DEFAULT_BIGARRAY_BOUND = 1000 * 1000  # MXNet's, when MXNET_KVSTORE_BIGARRAY_BOUND is unset

NOT_WRITTEN = (
    "the parameter servers {missing} did not write their optimizer states to {folder} "
    "(their standard error says why): every server must see the checkpoint directory at "
    "the same path (a file system every host shares), and be started by mxoid "
    "(mxoid launch, or python -m mxoid.distributed.launch --role server)"
)
NOT_LOADED = (
    "the parameter servers {left} did not load their optimizer states from {folder} "
    "(their standard error says why): every server must see the checkpoint directory at "
    "the same path (a file system every host shares), and be started by mxoid"
)


class ServerStatesError(RuntimeError):
    """The servers did not write or load their optimizer states; the message says which."""


def state_file(folder: str, rank: int) -> str:
    """Return the file of server ``rank``'s states in ``folder``."""
    return os.path.join(folder, f"server{rank}.states")


def server_layout() -> Dict[str, int]:
    """Return how the servers split the keys: their number and the big-array bound.

    Read from this worker's environment (``DMLC_NUM_SERVER``,
    ``MXNET_KVSTORE_BIGARRAY_BOUND``): the workers cut big arrays.
    """
    bound = os.environ.get("MXNET_KVSTORE_BIGARRAY_BOUND")
    return {
        "num_servers": int(os.environ.get("DMLC_NUM_SERVER", "1")),
        "bigarray_bound": int(bound) if bound else DEFAULT_BIGARRAY_BOUND,
    }


class StatesServer(mx.kv.KVStoreServer):
    """MXNet's server, whose controller also saves and loads its updater's states."""

    def _controller(self):  # type: ignore[no-untyped-def]
        stock = super()._controller()

        def controller(command: int, body: bytes, extra: object) -> None:
            if command == CONTROLLER_HEAD and body.startswith((SAVE, LOAD)):
                self._states(body)
            else:
                stock(command, body, extra)

        return controller

    def _states(self, body: bytes) -> None:
        """Save or load this server's states in the folder ``body`` names; errors to stderr."""
        saving = body.startswith(SAVE)
        folder = body[len(SAVE if saving else LOAD) :].decode("utf-8")
        path = state_file(folder, self.kvstore.rank)
        try:
            updater = self.kvstore._updater
            if updater is None:
                raise ServerStatesError("this server has no optimizer")
            if saving:
                with open(path, "wb") as handle:
                    handle.write(updater.get_states(dump_optimizer=True))
            else:
                with open(path, "rb") as handle:
                    updater.set_states(handle.read())
                os.remove(path)  # loaded: rank 0 finds none left
        except Exception as error:  # the server keeps serving: rank 0 reports it
            what = "save" if saving else "load"
            print(
                f"mxoid server {self.kvstore.rank}: cannot {what} its optimizer states "
                f"({path}): {type(error).__name__}: {error}",
                file=sys.stderr,
                flush=True,
            )


def fetch_server_states(kvstore: mx.kv.KVStore, folder: str) -> List[bytes]:
    """Return every server's states, by server rank (rank 0 only; ``folder`` is removed).

    ``folder`` must not exist; it is made, the servers write into it, and
    it is removed once read. Call it once rank 0's pulls are done (with
    ``dist_sync`` no server then updates until rank 0 pushes again).

    Raises
    ------
    ServerStatesError
        When a server wrote nothing.
    """
    num_servers = server_layout()["num_servers"]
    os.makedirs(folder)
    try:
        kvstore._send_command_to_servers(CONTROLLER_HEAD, (SAVE + folder.encode()).decode())
        missing = [r for r in range(num_servers) if not os.path.isfile(state_file(folder, r))]
        if missing:
            raise ServerStatesError(NOT_WRITTEN.format(missing=missing, folder=folder))
        states = []
        for rank in range(num_servers):
            with open(state_file(folder, rank), "rb") as handle:
                states.append(handle.read())
        return states
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def restore_server_states(
    kvstore: mx.kv.KVStore, states: Optional[List[bytes]], folder: str
) -> None:
    """Give every server its states back (rank 0 sends them); then every worker meets.

    A collective call, on every worker, made after :func:`set_server_optimizer`
    (whose barrier every worker has passed). ``states`` (rank 0's; None on
    the other ranks, or to restore nothing) are by server rank; ``folder``
    (rank 0's, must not exist) carries them to the servers and is removed.

    Raises
    ------
    ServerStatesError
        When a server did not load its states.
    """
    try:
        if kvstore.rank == 0 and states is not None:
            os.makedirs(folder)
            try:
                for rank, dump in enumerate(states):
                    with open(state_file(folder, rank), "wb") as handle:
                        handle.write(dump)
                body = (LOAD + folder.encode()).decode()
                kvstore._send_command_to_servers(CONTROLLER_HEAD, body)
                left = [r for r in range(len(states)) if os.path.isfile(state_file(folder, r))]
                if left:
                    raise ServerStatesError(NOT_LOADED.format(left=left, folder=folder))
            finally:
                shutil.rmtree(folder, ignore_errors=True)
    finally:
        kvstore._barrier()
