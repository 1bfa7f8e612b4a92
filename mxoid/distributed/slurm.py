"""``mxoid launch --slurm``: each task of one ``srun`` takes its role from SLURM and runs it.

Inside an allocation (``sbatch`` or ``salloc``)::

    srun --ntasks=4 --kill-on-bad-exit=1 mxoid launch --slurm -n 2 -s 1 -- python train.py

starts N = 1 + S + W tasks; each one reads the variables ``srun`` sets,
checks them (``SLURM_PROCID`` an integer below ``SLURM_NTASKS``, 1 + S + W
tasks), checks with task 0 that every task sees the same job
(:mod:`mxoid.distributed.slurm_check`, before anything binds), and becomes:

- task ``SLURM_PROCID`` 0: the ps-lite scheduler, on the first node of
  ``SLURM_STEP_NODELIST`` (else ``SLURM_JOB_NODELIST``), expanded here
  (:func:`expand_nodelist`: no ``scontrol`` needed);
- tasks 1 to S: the servers; the others: the workers, running the command;
- the scheduler's port: the first of ``SLURM_STEP_RESV_PORTS`` (``srun
  --resv-ports``) when set, else ``DMLC_PS_ROOT_PORT`` when set, else one
  derived from ``SLURM_JOB_ID`` and ``SLURM_STEP_ID`` (:func:`slurm_port`);
- each task's own address (``DMLC_NODE_HOST``): ``SLURMD_NODENAME``'s,
  unless ``DMLC_NODE_HOST`` or ``DMLC_INTERFACE`` is set already.

A worker task then *is* its process (``exec``): ``srun`` watches it, and
``--kill-on-bad-exit=1`` ends every task when one fails. A wrong task count
or a task that disagrees is an error on every task (status 2). The scheduler
and the servers run as children that ignore SIGINT and SIGTERM: SLURM
signals every task of the step at its time limit or at ``scancel``, and the
workers need them to agree on a stop and save a checkpoint. They end by
themselves once the workers have; ``--grace`` seconds (60 by default) after
the first signal their task ends them, so that none outlives a failed job.
"""

from __future__ import annotations

import ipaddress
import itertools
import os
import re
import signal
import socket
import subprocess
import sys
import time
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from .launched import EXEC_CODE, SCHEDULER_CODE
from .slurm_check import CHECK_TIMEOUT, CheckError, check_in, gather_tasks, job_shape

__all__ = ["SlurmError", "expand_nodelist", "run_slurm_task", "slurm_port", "slurm_task"]

PORT_BASE = 10000
PORT_SPAN = 22000  # 10000-31999: below Linux's ephemeral ports (32768-60999)
STOP_GRACE = 60.0
"""Seconds the scheduler and servers keep serving after SIGTERM (``--grace`` under SLURM)."""
REPORT_SECONDS = 10.0  # a task whose own check failed tries this long to tell task 0


class SlurmError(ValueError):
    """SLURM's variables do not describe the job asked for; says what to change."""


def expand_nodelist(text: str) -> List[str]:
    """Expand a SLURM node list, as ``scontrol show hostnames`` does.

    >>> expand_nodelist("node[01-03,07],gpu7")
    ['node01', 'node02', 'node03', 'node07', 'gpu7']
    >>> expand_nodelist("rack[1-2]-n[9-10]")
    ['rack1-n9', 'rack1-n10', 'rack2-n9', 'rack2-n10']
    """
    names: List[str] = []
    for item in _split_outside_brackets(text.strip()):
        if not item:
            continue
        parts = re.split(r"(\[[^\]]*\])", item)
        choices = [_expand_range(part[1:-1]) if part.startswith("[") else [part] for part in parts]
        names.extend("".join(combination) for combination in itertools.product(*choices))
    return names


def _split_outside_brackets(text: str) -> List[str]:
    items, depth, current = [], 0, ""
    for char in text:
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        if depth < 0 or depth > 1:
            raise SlurmError(f"cannot read the node list {text!r}: unbalanced brackets")
        if char == "," and depth == 0:
            items.append(current)
            current = ""
        else:
            current += char
    if depth:
        raise SlurmError(f"cannot read the node list {text!r}: unbalanced brackets")
    return items + [current]


def _expand_range(inside: str) -> List[str]:
    """``'01-03,7'`` -> ``['01', '02', '03', '7']``: zero padding kept, as SLURM writes it."""
    values = []
    for piece in inside.split(","):
        low, dash, high = piece.partition("-")
        if not low.isdigit() or dash and not high.isdigit():
            raise SlurmError(f"cannot read the node range [{inside}]")
        if not dash:
            values.append(low)
            continue
        if int(high) < int(low):
            raise SlurmError(f"cannot read the node range [{inside}]: {piece} goes down")
        values += [str(n).zfill(len(low)) for n in range(int(low), int(high) + 1)]
    return values


def slurm_port(env: Mapping[str, str]) -> int:
    """Return the scheduler's port, which every task finds alone (see the module's notes)."""
    reserved = env.get("SLURM_STEP_RESV_PORTS", "")
    if reserved:
        first = re.match(r"\d+", reserved)
        if first:
            return int(first.group())
    if env.get("DMLC_PS_ROOT_PORT", "").isdigit():
        return int(env["DMLC_PS_ROOT_PORT"])
    job, step = env.get("SLURM_JOB_ID", ""), env.get("SLURM_STEP_ID", "0")
    if not job.isdigit():
        raise SlurmError("SLURM_JOB_ID is not set: run 'mxoid launch --slurm' as a task of srun")
    return PORT_BASE + (int(job) * 17 + (int(step) if step.isdigit() else 0)) % PORT_SPAN


def _address(name: str) -> str:
    try:
        return socket.gethostbyname(name)
    except OSError as error:
        raise SlurmError(f"cannot resolve the node name {name!r}: {error}") from None


def _own_address(node: str, root: str) -> str:
    """Return this task's address.

    That is its node's, or the one that reaches the scheduler when the
    node's name resolves to a loopback address (a Debian /etc/hosts) but the
    scheduler's does not.
    """
    address = _address(node)
    if ipaddress.ip_address(address).is_loopback and not ipaddress.ip_address(root).is_loopback:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((root, 9))  # no packet is sent: this only picks the route
            address = probe.getsockname()[0]
    return address


def _procid_and_ntasks(env: Mapping[str, str]) -> Tuple[int, int]:
    """Return ``SLURM_PROCID`` and ``SLURM_NTASKS``: integers, the first below the second."""
    missing = [name for name in ("SLURM_PROCID", "SLURM_NTASKS") if not env.get(name, "").strip()]
    if missing:
        raise SlurmError(
            f"{' and '.join(missing)} not set: run 'mxoid launch --slurm' as a task of srun "
            "(srun --ntasks=N mxoid launch --slurm ...)"
        )
    for name in ("SLURM_PROCID", "SLURM_NTASKS"):
        if not env[name].strip().isdigit():
            raise SlurmError(
                f"{name} is {env[name]!r}, not an integer: srun sets it; do not set it by hand"
            )
    rank, tasks = int(env["SLURM_PROCID"]), int(env["SLURM_NTASKS"])
    if tasks < 1 or rank >= tasks:
        raise SlurmError(
            f"SLURM_PROCID {rank} is not a task of SLURM_NTASKS {tasks} (0 to {tasks - 1}): "
            "srun sets both; do not set them by hand"
        )
    return rank, tasks


def slurm_task(
    env: Mapping[str, str], num_workers: Optional[int], num_servers: int
) -> Tuple[str, int, Dict[str, str]]:
    """Return this task's role, its index among its role, and its ps-lite variables.

    Raises
    ------
    SlurmError
        When a SLURM variable is missing or not an integer, ``SLURM_PROCID`` is
        not below ``SLURM_NTASKS``, or the task count is not 1 + S + W.
    """
    rank, tasks = _procid_and_ntasks(env)
    workers = tasks - 1 - num_servers if num_workers is None else num_workers
    if workers < 1 or tasks != 1 + num_servers + workers:
        raise SlurmError(
            f"srun started {tasks} tasks, but the job needs 1 scheduler + {num_servers} "
            f"server(s) + {workers} worker(s) = {1 + num_servers + workers}: run srun "
            f"--ntasks={1 + num_servers + max(workers, 1)}, or change -n / -s"
        )
    listed = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or ""
    nodes = expand_nodelist(listed)
    node = env.get("SLURMD_NODENAME") or socket.gethostname()
    if not nodes:
        raise SlurmError("SLURM_STEP_NODELIST and SLURM_JOB_NODELIST are not set")
    if rank == 0 and node != nodes[0]:
        raise SlurmError(
            f"task 0 runs on {node}, but the scheduler's address is the first node of the "
            f"step, {nodes[0]}: start the step with srun --distribution=block (or cyclic)"
        )
    root = _address(nodes[0])
    variables = {
        "DMLC_PS_ROOT_URI": root,
        "DMLC_PS_ROOT_PORT": str(slurm_port(env)),
        "DMLC_NUM_SERVER": str(num_servers),
        "DMLC_NUM_WORKER": str(workers),
        "PYTHONUNBUFFERED": "1",
    }
    if not env.get("DMLC_NODE_HOST") and not env.get("DMLC_INTERFACE"):
        variables["DMLC_NODE_HOST"] = _own_address(node, root)
    if rank == 0:
        return "scheduler", 0, variables
    if rank <= num_servers:
        return "server", rank - 1, variables
    return "worker", rank - 1 - num_servers, variables


def _check_address(env: Mapping[str, str]) -> Tuple[str, int]:
    """Return task 0's address and port, for a task whose own variables are wrong."""
    nodes = expand_nodelist(env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or "")
    if not nodes:
        raise SlurmError("no node list")
    return _address(nodes[0]), slurm_port(env)


def _check_tasks(
    env: Mapping[str, str], num_workers: Optional[int], num_servers: int, check_timeout: float
) -> Tuple[str, int, Dict[str, str]]:
    """Return this task's role, index and variables once every task agrees on the job.

    Raises
    ------
    SlurmError
        This task's own error (said to task 0 too, when it can be reached), or
        the job's, the same on every task.
    """
    try:
        role, index, variables = slurm_task(env, num_workers, num_servers)
    except SlurmError as error:
        if env.get("SLURM_PROCID", "").strip() == "0":
            raise
        try:
            root, port = _check_address(env)
        except SlurmError:
            raise error from None
        shape = job_shape(env, num_workers, num_servers, root, port)
        check_in(shape, min(check_timeout, REPORT_SECONDS), error=str(error))
        raise
    root, port = variables["DMLC_PS_ROOT_URI"], int(variables["DMLC_PS_ROOT_PORT"])
    shape = job_shape(env, num_workers, num_servers, root, port)
    try:
        if role == "scheduler":
            gather_tasks(shape, int(env["SLURM_NTASKS"]), check_timeout)
        else:
            check_in(shape, check_timeout)
    except CheckError as error:
        raise SlurmError(str(error)) from None
    return role, index, variables


def run_slurm_task(
    command: Sequence[str],
    num_workers: Optional[int],
    num_servers: int,
    check_timeout: float = CHECK_TIMEOUT,
    grace: float = STOP_GRACE,
) -> int:
    """Run this task's process once every task agrees; return 2 after a :class:`SlurmError`.

    A worker becomes its command (``exec``); the scheduler and the servers run
    under this process (:func:`_serve`), which ends them ``grace`` seconds after
    a SIGTERM or SIGINT.
    """
    env = dict(os.environ)
    try:
        role, index, variables = _check_tasks(env, num_workers, num_servers, check_timeout)
    except SlurmError as error:
        task = env.get("SLURM_PROCID", "?")
        print(f"mxoid launch --slurm (task {task}): error: {error}", file=sys.stderr, flush=True)
        return 2
    env.update(variables)
    env.pop("DMLC_ROLE", None)
    if role == "scheduler":
        argv = [sys.executable, "-c", SCHEDULER_CODE]
    elif role == "server":  # a server sets its role once mxoid is imported
        argv = [sys.executable, "-m", "mxoid.distributed.launch", "--role", "server"]
    else:
        argv = list(command)
    if role != "server":
        env["DMLC_ROLE"] = role
    print(
        f"mxoid launch --slurm: task {env['SLURM_PROCID']} on "
        f"{env.get('SLURMD_NODENAME', socket.gethostname())} is {role} {index}; scheduler at "
        f"{variables['DMLC_PS_ROOT_URI']}:{variables['DMLC_PS_ROOT_PORT']}",
        file=sys.stderr,
        flush=True,
    )
    sys.stdout.flush()
    if role != "worker":
        return _serve(argv, env, grace, f"{role} {index}")
    try:
        os.execvpe(argv[0], argv, env)
    except OSError as error:
        print(f"mxoid launch --slurm: cannot run {argv[0]!r}: {error}", file=sys.stderr)
        return 127
    return 0  # not reached


def _serve(argv: Sequence[str], env: Dict[str, str], grace: float, label: str) -> int:
    """Run the scheduler or a server as a child that ignores SIGINT and SIGTERM; its status.

    SLURM signals every task at its time limit or at ``scancel``, and the
    workers then still need the servers to agree on a stop and save. So the
    child keeps serving, and ends by itself after the workers; but ``grace``
    seconds after the first signal (the job is ending, or failed: no role
    outlives it), this process SIGKILLs the child and exits with 128 + N.
    """
    signalled: List[int] = []
    previous = {
        number: signal.signal(number, signal.SIG_IGN) for number in (signal.SIGINT, signal.SIGTERM)
    }
    wrapped = [sys.executable, "-S", "-c", EXEC_CODE, str(os.getpid()), *argv]
    try:
        child = subprocess.Popen(wrapped, env=env, start_new_session=True)
    finally:
        for number in previous:  # the child keeps ignoring them; this process hears them
            signal.signal(number, lambda number, frame: signalled.append(number))
    first = None
    while child.poll() is None:
        if signalled and first is None:
            first = time.monotonic()
        if first is not None and time.monotonic() - first > grace:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
            name = signal.Signals(signalled[0]).name
            print(
                f"mxoid launch --slurm: the {label} still ran {grace:g} s after {name} "
                "(--grace): ended it",
                file=sys.stderr,
                flush=True,
            )
            return 128 + signalled[0]
        time.sleep(0.1)
    return 128 - child.returncode if child.returncode < 0 else child.returncode
