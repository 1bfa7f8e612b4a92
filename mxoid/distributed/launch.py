"""``mxoid launch``: run a distributed training job on this machine, and never hang.

Starts a ps-lite scheduler, servers and workers on 127.0.0.1, prefixes each
process's output with its role and launch index, and exits with the
workers' status. When any process dies or fails, it stops the others::

    mxoid launch -n 2 -s 1 --timeout 600 --stall-timeout 120 -- python train.py --lr 0.1
    python -m mxoid.distributed.launch -n 2 -- python train.py

Every process gets ``DMLC_PS_ROOT_URI=127.0.0.1``, ``DMLC_PS_ROOT_PORT`` (a
free port, found again when the scheduler cannot bind it),
``DMLC_NUM_SERVER``, ``DMLC_NUM_WORKER`` and ``DMLC_NODE_HOST=127.0.0.1``,
plus ``PYTHONUNBUFFERED=1``; workers get ``DMLC_ROLE=worker`` and run the
command. Ranks (``kv.rank``) are assigned by the scheduler, not in launch
order: a worker that wants to show its rank prints it.

Several hosts
-------------
``--hosts`` does not exist: ``mxoid launch`` starts every process on this
machine. On several hosts, start the processes yourself (ssh, a cluster
scheduler). Each needs ``DMLC_PS_ROOT_URI`` (the scheduler's address,
reachable from every host), ``DMLC_PS_ROOT_PORT``, ``DMLC_NUM_SERVER``,
``DMLC_NUM_WORKER`` and ``DMLC_NODE_HOST`` (its own host's address), then:

- the scheduler: ``DMLC_ROLE=scheduler python -c "import mxnet"``;
- each server: ``python -m mxoid.distributed.launch --role server`` with ``DMLC_ROLE``
  unset (see :func:`mxoid.distributed.run_server`);
- each worker: ``DMLC_ROLE=worker python train.py``.

Nothing then watches them, and ps-lite detects no failure: give each
process a time limit.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from typing import BinaryIO, List, Optional, Sequence

from .processes import DEFAULT_STALL_TIMEOUT, EXIT_FAILURE, SCHEDULER_START_SECONDS, Job

__all__ = ["launch", "main"]

NO_HOSTS = (
    "--hosts is not supported: mxoid launch starts every process on this machine. To train on "
    "several hosts, start the scheduler, servers and workers yourself with the environment "
    "listed in 'python -m mxoid.distributed.launch --help' (and the README, 'Distributed training')"
)

DESCRIPTION = """\
Run COMMAND as WORKERS distributed-training workers on this machine, with a
ps-lite scheduler and SERVERS parameter servers, all on 127.0.0.1. Output
lines are prefixed with the process's role and launch index (ranks, kv.rank,
are assigned later by the scheduler).

Exit status: the workers' (0 when every worker succeeded). When any process
fails or dies, the others get the grace period to end, then SIGTERM, then
SIGKILL after another grace period, and the status is non-zero, with a
one-line reason: the failed worker's status, 128+N when a worker was killed
by signal N, 124 after --timeout or --stall-timeout, 1 when the scheduler or
a server failed.

--stall-timeout S (default 300; 0: never): the job is stalled when, for S
seconds, no process wrote any output and no process used any CPU time
(processes blocked on a dead peer sit at exactly 0% CPU); it is then stopped
like a failure.

Ctrl-C or SIGTERM to the launcher is passed on to every worker, which stops
training cleanly as a single process would (Ctrl-C: at the end of the epoch;
SIGTERM or a second Ctrl-C: after the batch the workers agree on), saves its
checkpoint and exits with 130 or 143; the launcher then exits with that
status. A third one ends everything at once. A worker that exits on a signal
gives the others 60 s to stop too; a worker that exits with status 0 while
the others keep running for 30 s more has left them waiting for it, which
is a failure.

Several hosts: not supported (there is no --hosts). Start the processes
yourself; each needs DMLC_PS_ROOT_URI (the scheduler's address),
DMLC_PS_ROOT_PORT, DMLC_NUM_SERVER, DMLC_NUM_WORKER and DMLC_NODE_HOST (its
own host's address). Scheduler: DMLC_ROLE=scheduler python -c "import mxnet".
Servers: python -m mxoid.distributed.launch --role server, with DMLC_ROLE unset.
Workers: DMLC_ROLE=worker python train.py. Nothing then watches them."""


def launch(
    command: Sequence[str],
    num_workers: int,
    num_servers: int = 1,
    *,
    timeout: Optional[float] = None,
    stall_timeout: Optional[float] = DEFAULT_STALL_TIMEOUT,
    grace: float = 3.0,
    stdout: Optional[BinaryIO] = None,
    stderr: Optional[BinaryIO] = None,
) -> int:
    """Run ``command`` as ``num_workers`` workers with a scheduler and servers; return the status.

    See the module documentation and ``python -m mxoid.distributed.launch --help``.

    Parameters
    ----------
    command : sequence of str
        The worker command, e.g. ``['python', 'train.py']``.
    num_workers, num_servers : int
    timeout : float, optional
        Seconds for the whole job.
    stall_timeout : float or None, default 300
        Seconds without output and without CPU time used by any process;
        None never stops a stalled job.
    grace : float, default 3
        Seconds between the end of the workers (or a failure) and SIGTERM
        to the processes still running, and between SIGTERM and SIGKILL.
    stdout, stderr : binary file, optional
        Where the prefixed output goes; this process's by default.

    Returns
    -------
    int
        0 when every worker succeeded, otherwise as described in ``--help``.
    """
    if not command:
        raise ValueError("no command to run: give it after '--'")
    if num_workers < 1 or num_servers < 1:
        raise ValueError("need at least one worker and one server")
    job = Job(
        num_workers, num_servers, grace, stdout or sys.stdout.buffer, stderr or sys.stderr.buffer
    )
    deadline = None if timeout is None else time.monotonic() + timeout
    previous = {
        sig: signal.signal(sig, lambda number, frame: job.signals.append(number))
        for sig in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        port, reason = job.start_scheduler(deadline or time.monotonic() + SCHEDULER_START_SECONDS)
        if port is None:
            status = 128 + job.stop_signal if job.stop_signal else EXIT_FAILURE
            reason = reason if job.stop_signal is None else "the launcher was interrupted"
        else:
            server = [sys.executable, "-m", "mxoid.distributed.launch", "--role", "server"]
            for index in range(num_servers):
                job.start("server", index, server, port)
            for index in range(num_workers):
                job.start("worker", index, command, port)
            status, reason = job.wait(deadline, stall_timeout)
        signalled = job.finish()
        if status != 0:
            job.note(
                f"{reason}; stopped {len(signalled)} other process(es)" if signalled else reason
            )
        elif signalled:
            job.note(
                "workers finished; stopped "
                + ", ".join(p.label for p in signalled)
                + " (still running after the grace period)"
            )
        return status
    finally:
        job.kill_remaining()  # none left, unless something above was interrupted
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mxoid launch",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="%(prog)s -n WORKERS [-s SERVERS] [--timeout S] [--stall-timeout S] "
        "[--grace S] -- COMMAND [ARGS...]",
    )
    parser.add_argument("-n", "--num-workers", type=int, help="number of workers")
    parser.add_argument(
        "-s", "--num-servers", type=int, default=1, help="number of parameter servers (default 1)"
    )
    parser.add_argument(
        "--timeout", type=float, metavar="S", help="stop everything after S seconds (status 124)"
    )
    parser.add_argument(
        "--stall-timeout",
        type=float,
        metavar="S",
        default=DEFAULT_STALL_TIMEOUT,
        help="stop everything after S seconds without output or CPU use "
        f"(status 124; default {DEFAULT_STALL_TIMEOUT:g}, 0: never)",
    )
    parser.add_argument(
        "--grace",
        type=float,
        default=3.0,
        metavar="S",
        help="seconds before SIGTERM, then before SIGKILL (default 3)",
    )
    parser.add_argument("--hosts", metavar="FILE", help="not supported (see 'Several hosts')")
    parser.add_argument(
        "--role",
        choices=("server", "scheduler"),
        help="run one server or scheduler process of a job started by hand "
        "(with the DMLC_* environment but DMLC_ROLE unset)",
    )
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of ``mxoid launch`` and ``python -m mxoid.distributed.launch``.

    Returns the exit status.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    command: List[str] = []
    if "--" in argv:
        split = argv.index("--")
        argv, command = argv[:split], argv[split + 1 :]
    parser = _parser()
    args = parser.parse_args(argv)
    if args.role is not None:
        from .servers import run_server

        run_server(args.role)
        return 0
    if args.hosts is not None:
        parser.error(NO_HOSTS)
    if args.num_workers is None or args.num_workers < 1:
        parser.error("give the number of workers, -n WORKERS (at least 1)")
    if args.num_servers < 1:
        parser.error("-s SERVERS must be at least 1")
    if not command:
        parser.error("give the worker command after '--', e.g. -- python train.py")
    if args.timeout is not None and args.timeout <= 0:
        parser.error("--timeout must be positive")
    if args.stall_timeout < 0:
        parser.error("--stall-timeout must be positive (or 0: never)")
    return launch(
        command,
        args.num_workers,
        args.num_servers,
        timeout=args.timeout,
        stall_timeout=args.stall_timeout or None,
        grace=args.grace,
    )


if __name__ == "__main__":
    sys.exit(main())
