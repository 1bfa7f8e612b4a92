"""``mxoid launch``: run a distributed training job on one host or several, and never hang.

Starts a ps-lite scheduler, servers and workers, prefixes each process's
output with its role, index (a worker's rank once known) and host, and exits
with the workers' status. When any process dies or fails, it stops the others::

    mxoid launch -n 2 -s 1 --timeout 600 --stall-timeout 120 -- python train.py --lr 0.1
    mxoid launch -n 4 -s 2 -H hosts.txt --env OMP_NUM_THREADS -- python train.py
    srun --ntasks=4 --kill-on-bad-exit=1 mxoid launch --slurm -n 2 -s 1 -- python train.py
    python -m mxoid.distributed.launch -n 2 -- python train.py

On one host every process gets ``DMLC_PS_ROOT_URI=127.0.0.1``,
``DMLC_PS_ROOT_PORT`` (a free port, found again when the scheduler cannot
bind it), ``DMLC_NUM_SERVER``, ``DMLC_NUM_WORKER`` and
``DMLC_NODE_HOST=127.0.0.1``, plus ``PYTHONUNBUFFERED=1``; workers get
``DMLC_ROLE=worker`` and run the command. Ranks (``kv.rank``) are assigned
by the scheduler: on one host the launcher gives workers and servers
ascending ``PORT`` values in launch order, which ps-lite ranks in that order;
a worker tells the launcher its rank when mxoid creates its kvstore, and its
lines are labelled with it from then on (see
:func:`mxoid.distributed.tell_launcher_rank`).

Several hosts (``-H HOSTFILE``): see :mod:`mxoid.distributed.hosts` and
:mod:`mxoid.distributed.agent`; SLURM (``--slurm``): see
:mod:`mxoid.distributed.slurm`. Processes started by hand need the same
variables; servers then run ``python -m mxoid.distributed.launch --role
server`` with ``DMLC_ROLE`` unset (see :func:`mxoid.distributed.run_server`).
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import sys
import time
from typing import BinaryIO, Dict, List, Optional, Sequence

from .hosts import Host, HostError, Remote, check_hosts, parse_host_file, place
from .processes import DEFAULT_STALL_TIMEOUT, EXIT_FAILURE, SCHEDULER_START_SECONDS, Job
from .slurm_check import CHECK_TIMEOUT

__all__ = ["launch", "main"]

DESCRIPTION = """\
Run COMMAND as WORKERS distributed-training workers, with a ps-lite scheduler
and SERVERS parameter servers: on this machine (127.0.0.1), on the hosts of
a host file (-H), or as the tasks of one srun (--slurm). Output lines are
prefixed with the process's role, index and host: a worker's index is its rank
(kv.rank) once mxoid has created its kvstore (before that, its launch index,
which on one host is its rank too).

What ends a job: the workers ending (all with status 0), or any process
failing or dying; then the others get the grace period to end, then SIGTERM,
then SIGKILL after another grace period, and the last line gives the reason.
Exit status:
  0        every worker succeeded
  N        a worker failed with status N (its own)
  128+N    a worker was killed by signal N, or every worker stopped cleanly
           after signal N (Ctrl-C: 130, SIGTERM: 143)
  124      --timeout or --stall-timeout
  1        the scheduler, a server or an SSH connection failed (ssh's 255
           too), a worker ended alone with status 0, or a host cannot run it
  2        wrong arguments; with --slurm, a task's check failed (every task)

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

Several hosts, -H HOSTFILE: one host a line, HOST or HOST:SSH_PORT (blank
lines and # comments ignored). The scheduler runs on the first host (or
--scheduler-host), server i and worker i on host i modulo the hosts. Each
process runs through SSH (--ssh-command, default ssh, with BatchMode and a
connect timeout) under 'python -m mxoid.distributed.agent', this Python at
the same path, in this working directory, with its DMLC_* variables (its
DMLC_NODE_HOST is its host's address) and the variables named by --env.
Every host is checked first: a login without a prompt, the same Python,
MXNet and mxoid, this directory. A process of another host ends when its
SSH connection ends; a lost connection (ssh exits 255, or kills itself
after 15 s without an answer) fails the job like a dead process.

SLURM, --slurm: run as every task of one srun of 1 + SERVERS + WORKERS
tasks; task 0 is the scheduler (on the step's first node), tasks 1..SERVERS
the servers, the others the workers. Use srun --kill-on-bad-exit=1. Before
anything binds, every task checks in with task 0 (within --check-timeout):
a wrong SLURM_PROCID, tasks that disagree on the job, or a port in use end
every task with status 2 and the same error. The scheduler and servers
ignore SIGTERM, so that the workers can stop cleanly, but their task ends
them --grace seconds (default 60 under --slurm) after the first SIGTERM."""


def _carried(names: Sequence[str]) -> Dict[str, str]:
    """Return the variables ``--env`` carries to other hosts: NAME (its value) or NAME=VALUE."""
    carried = {}
    for item in names:
        name, equals, value = item.partition("=")
        if not equals:
            if name not in os.environ:
                raise HostError(f"--env {name}: {name} is not set here")
            value = os.environ[name]
        carried[name] = value
    return carried


def _scheduler_host(hosts: Sequence[Host], wanted: Optional[str]) -> Host:
    if wanted is None:
        return hosts[0]
    for host in hosts:
        if wanted in (host.name, host.address, f"{host.name}:{host.ssh_port}"):
            return host
    raise HostError(f"--scheduler-host {wanted}: not a host of the host file")


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
    hosts: Optional[str | Sequence[Host]] = None,
    ssh_command: str | Sequence[str] = "ssh",
    scheduler_host: Optional[str] = None,
    env: Sequence[str] = (),
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
    hosts : str or sequence of Host, optional
        A host file, or its hosts: run the processes there, through SSH.
    ssh_command : str or sequence of str, default 'ssh'
        The SSH client (a string is split as a shell would).
    scheduler_host : str, optional
        The host of the scheduler (a host of ``hosts``; the first by default).
    env : sequence of str
        ``NAME`` or ``NAME=VALUE``: variables the processes of other hosts get.

    Returns
    -------
    int
        0 when every worker succeeded, otherwise as described in ``--help``;
        1 when a host cannot run the job (said on ``stderr``).
    """
    if not command:
        raise ValueError("no command to run: give it after '--'")
    if num_workers < 1 or num_servers < 1:
        raise ValueError("need at least one worker and one server")
    out, err = stdout or sys.stdout.buffer, stderr or sys.stderr.buffer
    remote = None
    if hosts is not None:
        try:
            listed = parse_host_file(hosts) if isinstance(hosts, str) else list(hosts)
            ssh = shlex.split(ssh_command) if isinstance(ssh_command, str) else list(ssh_command)
            remote = Remote(ssh, listed, _scheduler_host(listed, scheduler_host), _carried(env))
            check_hosts(ssh, [remote.scheduler_host, *listed], remote.carried)
        except HostError as error:
            err.write(f"mxoid launch: {error}\n".encode())
            err.flush()
            return EXIT_FAILURE
    job = Job(num_workers, num_servers, grace, out, err, remote)
    deadline = None if timeout is None else time.monotonic() + timeout
    previous = {
        sig: signal.signal(sig, lambda number, frame: job.signals.append(number))
        for sig in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        return _run(job, command, deadline, stall_timeout)
    finally:
        job.kill_remaining()  # none left, unless something above was interrupted
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _run(
    job: Job, command: Sequence[str], deadline: Optional[float], stall_timeout: Optional[float]
) -> int:
    """Start the job's processes, wait for its end, stop what is left; return the status."""
    port, reason = job.start_scheduler(deadline or time.monotonic() + SCHEDULER_START_SECONDS)
    if port is None:
        status = 128 + job.stop_signal if job.stop_signal else EXIT_FAILURE
        reason = reason if job.stop_signal is None else "the launcher was interrupted"
    else:
        hosts = job.remote.hosts if job.remote is not None else [None]
        server = [sys.executable, "-m", "mxoid.distributed.launch", "--role", "server"]
        for index, host in enumerate(place(hosts, job.num_servers)):
            job.start("server", index, server, port, host=host)
        for index, host in enumerate(place(hosts, job.num_workers)):
            job.start("worker", index, command, port, host=host)
        status, reason = job.wait(deadline, stall_timeout)
    signalled = job.finish()
    if status != 0:
        job.note(f"{reason}; stopped {len(signalled)} other process(es)" if signalled else reason)
    elif signalled:
        job.note(
            "workers finished; stopped "
            + ", ".join(p.label for p in signalled)
            + " (still running after the grace period)"
        )
    return status


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mxoid launch",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="%(prog)s -n WORKERS [-s SERVERS] [-H HOSTFILE | --slurm] [--timeout S] "
        "[--stall-timeout S] [--grace S] -- COMMAND [ARGS...]",
    )
    add = parser.add_argument
    add("-n", "--num-workers", type=int, help="number of workers")
    add("-s", "--num-servers", type=int, default=1, help="number of parameter servers (default 1)")
    add("--timeout", type=float, metavar="S", help="stop everything after S seconds (status 124)")
    add(
        "--stall-timeout",
        type=float,
        metavar="S",
        default=DEFAULT_STALL_TIMEOUT,
        help="stop everything after S seconds without output or CPU use "
        f"(status 124; default {DEFAULT_STALL_TIMEOUT:g}, 0: never)",
    )
    add(
        "--grace",
        type=float,
        metavar="S",
        help="seconds before SIGTERM, then before SIGKILL (default 3); with --slurm, seconds "
        "the scheduler and servers keep serving after SIGTERM (default 60)",
    )
    add(
        "--check-timeout",
        type=float,
        metavar="S",
        default=CHECK_TIMEOUT,
        help="with --slurm: seconds every task has to check in with task 0 before anything "
        f"binds (default {CHECK_TIMEOUT:g})",
    )
    add("-H", "--hosts", metavar="HOSTFILE", help="run on these hosts, through SSH")
    add("--scheduler-host", metavar="HOST", help="the scheduler's host (default: the first)")
    add(
        "--ssh-command",
        default="ssh",
        metavar="CMD",
        help="the SSH client, split as a shell would (default: ssh); the launcher adds "
        "BatchMode and timeout options, -p PORT, the host and the remote command",
    )
    add(
        "--env",
        action="append",
        default=[],
        metavar="NAME[=VALUE]",
        help="a variable the processes of other hosts get (repeatable)",
    )
    add("--slurm", action="store_true", help="run as one task of srun (see above)")
    add(
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
    if args.num_servers < 1:
        parser.error("-s SERVERS must be at least 1")
    if not command:
        parser.error("give the worker command after '--', e.g. -- python train.py")
    if args.slurm:
        if args.hosts is not None:
            parser.error("--slurm and --hosts exclude each other: SLURM places the tasks")
        from .slurm import STOP_GRACE, run_slurm_task

        return run_slurm_task(
            command,
            args.num_workers,
            args.num_servers,
            check_timeout=args.check_timeout,
            grace=STOP_GRACE if args.grace is None else args.grace,
        )
    if args.num_workers is None or args.num_workers < 1:
        parser.error("give the number of workers, -n WORKERS (at least 1)")
    if args.timeout is not None and args.timeout <= 0:
        parser.error("--timeout must be positive")
    if args.stall_timeout < 0:
        parser.error("--stall-timeout must be positive (or 0: never)")
    if args.hosts is None and (args.scheduler_host or args.env or args.ssh_command != "ssh"):
        parser.error("--scheduler-host, --ssh-command and --env go with -H HOSTFILE")
    if args.hosts is not None and not os.path.isfile(args.hosts):
        parser.error(f"-H {args.hosts}: no such file")
    _warn_inside_srun(args.hosts is None)
    return launch(
        command,
        args.num_workers,
        args.num_servers,
        timeout=args.timeout,
        stall_timeout=args.stall_timeout or None,
        grace=3.0 if args.grace is None else args.grace,
        hosts=args.hosts,
        ssh_command=args.ssh_command,
        scheduler_host=args.scheduler_host,
        env=args.env,
    )


def _warn_inside_srun(local: bool) -> None:
    """Warn that a launch on one host in an srun of several tasks starts a job per task."""
    tasks = os.environ.get("SLURM_STEP_NUM_TASKS", "1")
    if local and tasks.isdigit() and int(tasks) > 1:
        print(
            f"mxoid launch: warning: this is one of {tasks} tasks of an srun, and each starts a "
            "whole job on its node; to make the tasks one job, add --slurm",
            file=sys.stderr,
        )


if __name__ == "__main__":
    sys.exit(main())
