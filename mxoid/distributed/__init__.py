"""Distributed training on MXNet's own parameter server (ps-lite), on one host or several.

- :mod:`.servers`: the parameter servers' update rule (:class:`ServerOptimizer`) and how
  to start a server;
- :mod:`.workers`: what a worker does beside training: exact exchanges with the other
  workers, the equal-steps check, the final pull, exiting after an error;
- :mod:`.sharding`: each worker's equal share of the data;
- :mod:`.launch`, :mod:`.processes` and :mod:`.output`: ``mxoid launch``, which runs a job
  and never hangs;
  :mod:`.hosts` and :mod:`.agent` on several hosts through SSH, :mod:`.slurm` under SLURM;
- :mod:`.exits`: in a worker process (``DMLC_ROLE=worker``), installed on import: an
  error anywhere in the script ends the worker instead of ps-lite's finalize barrier.

The names are imported on first use, so that ``mxoid launch`` starts without loading MXNet.
"""

import os

from ..lazy import lazy_exports

if os.environ.get("DMLC_ROLE") == "worker":
    from .exits import install_worker_exit_hooks

    install_worker_exit_hooks()

_EXPORTS = {
    "MERGED": "servers",
    "ServerOptimizer": "servers",
    "is_asynchronous": "servers",
    "is_distributed": "servers",
    "run_server": "servers",
    "set_server_optimizer": "servers",
    "agree_to_stop": "workers",
    "allgather": "workers",
    "allgather_json": "workers",
    "allreduce_sums": "workers",
    "check_equal_steps": "workers",
    "check_same_checkpoint": "workers",
    "exit_after_error": "workers",
    "pull_parameters": "workers",
    "tell_launcher_rank": "workers",
    "shard": "sharding",
    "shard_arrays": "sharding",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
