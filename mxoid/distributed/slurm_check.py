"""``mxoid launch --slurm``: the tasks check each other before anything binds.

Each task checks its own variables (:func:`mxoid.distributed.slurm.slurm_task`),
but tasks that disagree (another ``SLURM_NTASKS``, another ``-n`` or ``-s``,
another job) would start a job whose server crashes ("operands shape
mismatch") and whose workers wait forever. So, before ps-lite starts, task 0
listens on the scheduler's port itself, with a deadline
(``--check-timeout``, 60 s by default), and every other task connects and
sends its job's shape (:func:`job_shape`). Once every task has checked in,
task 0 answers every task at once: ``ok``, or the one error that every task
then prints before it exits with status 2. Task 0 then closes the port, which
the ps-lite scheduler binds next.

A task whose own variables are wrong (``SLURM_PROCID=7`` with
``SLURM_NTASKS=4``) says so, and tells task 0, which fails the job on every
task. When task 0 cannot bind the port (another program holds it), the other
tasks find a port that does not answer as task 0 and fail, naming the port
and the fix, or fail at the deadline when nothing answers at all.
"""

from __future__ import annotations

import json
import socket
import time
from typing import Any, Dict, List, Mapping, Optional, Tuple

__all__ = ["CHECK_TIMEOUT", "check_in", "gather_tasks", "job_shape"]

CHECK_TIMEOUT = 60.0
"""Seconds the tasks have to check in with task 0 (``--check-timeout``)."""
GREETING = "mxoid-launch-slurm-check"
ANSWER_SECONDS = 5.0  # for a connected peer to say its line
COMPARED = {
    "ntasks": "SLURM_NTASKS",
    "job": "SLURM_JOB_ID",
    "step": "SLURM_STEP_ID",
    "servers": "-s",
    "workers": "-n",
    "root": "the scheduler's address",
    "port": "the port",
}
FIX = "start every task with one srun, with the same 'mxoid launch --slurm' options"
BUSY_PORT = (
    "port {port} of {where} is in use by another program{detail}. The port is derived from "
    "SLURM_JOB_ID and SLURM_STEP_ID; fix: run srun with --resv-ports, or set "
    "DMLC_PS_ROOT_PORT to a free port for every task (export DMLC_PS_ROOT_PORT=N before srun)"
)


class CheckError(ValueError):
    """The tasks cannot start the job together; says why, the same on every task."""


def job_shape(
    env: Mapping[str, str], num_workers: Optional[int], num_servers: int, root: str, port: int
) -> Dict[str, Any]:
    """Return what every task of the job must agree on, as this task sees it."""
    return {
        "procid": env.get("SLURM_PROCID", ""),
        "ntasks": env.get("SLURM_NTASKS", ""),
        "job": env.get("SLURM_JOB_ID", ""),
        "step": env.get("SLURM_STEP_ID", "0"),
        "servers": num_servers,
        "workers": num_workers,
        "root": root,
        "port": port,
    }


def _line(connection: socket.socket, seconds: float) -> str:
    """Read one line from ``connection`` within ``seconds`` ('' at end of file)."""
    connection.settimeout(max(0.05, seconds))
    data = b""
    while not data.endswith(b"\n"):
        chunk = connection.recv(4096)
        if not chunk:
            break
        data += chunk
    return data.decode(errors="replace").strip()


def _differences(mine: Dict[str, Any], reports: List[Dict[str, Any]]) -> List[str]:
    problems = []
    for other in reports:
        task = f"task {other.get('procid') or '?'}"
        if "error" in other:
            problems.append(f"{task} failed its own check: {other['error']}")
            continue
        for key, name in COMPARED.items():
            if other.get(key) != mine[key]:
                problems.append(
                    f"{task} has {name} {other.get(key)!r} where task 0 has {mine[key]!r}"
                )
    seen = [other.get("procid") for other in reports if "error" not in other]
    for procid in sorted({p for p in seen if seen.count(p) > 1}):
        problems.append(f"two tasks have SLURM_PROCID {procid}")
    return problems


def gather_tasks(mine: Dict[str, Any], tasks: int, timeout: float) -> None:
    """Task 0: hear every other task on the port, then answer them all; raise on a problem.

    Raises
    ------
    CheckError
        When the port is taken, a task disagrees or failed, or not every task
        checked in within ``timeout`` seconds (also said to every task heard).
    """
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind(("", mine["port"]))
    except OSError as error:
        listener.close()
        detail = f" ({error.strerror or error}), so task 0 cannot listen there"
        message = BUSY_PORT.format(port=mine["port"], where="this node", detail=detail)
        raise CheckError(message) from None
    listener.listen(max(8, tasks))
    listener.settimeout(0.2)
    heard: List[Tuple[socket.socket, Dict[str, Any]]] = []
    deadline = time.monotonic() + timeout
    try:
        while len(heard) < tasks - 1 and time.monotonic() < deadline:
            try:
                connection, _ = listener.accept()
            except socket.timeout:
                continue
            try:
                connection.sendall(f"{GREETING} {mine['job']}.{mine['step']}\n".encode())
                heard.append((connection, json.loads(_line(connection, ANSWER_SECONDS))))
            except (OSError, ValueError):
                connection.close()
        problems = _differences(mine, [report for _, report in heard])
        if len(heard) < tasks - 1:
            problems.append(
                f"only {len(heard) + 1} of {tasks} tasks checked in within {timeout:g} s "
                "(--check-timeout)"
            )
        verdict = "ok" if not problems else "; ".join(problems) + f". Fix: {FIX}"
        for connection, _ in heard:
            try:
                connection.sendall(verdict.encode() + b"\n")
            except OSError:
                pass
        for connection, _ in heard:  # the peers close first: no TIME_WAIT on the port here
            try:
                _line(connection, 2.0)
            except OSError:
                pass
    finally:
        for connection, _ in heard:
            connection.close()
        listener.close()
    if problems:
        raise CheckError(verdict)


def check_in(shape: Dict[str, Any], timeout: float, error: Optional[str] = None) -> None:
    """Any task but 0: send ``shape`` to task 0 and wait for its answer; raise unless ok.

    With ``error`` (this task's own check failed), tell task 0 and return at
    once, or quietly when task 0 cannot be reached within ``timeout``.

    Raises
    ------
    CheckError
        Task 0's answer, or why task 0 could not be asked.
    """
    root, port = shape["root"], shape["port"]
    deadline = time.monotonic() + timeout
    expected = f"{GREETING} {shape['job']}.{shape['step']}"
    while time.monotonic() < deadline:
        try:
            connection = socket.create_connection((root, port), timeout=2.0)
        except OSError:
            time.sleep(0.2)
            continue
        with connection:
            try:
                greeting = _line(connection, min(ANSWER_SECONDS, deadline - time.monotonic()))
            except OSError:
                greeting = ""
            if greeting != expected:
                if error is not None:
                    return
                said = f"it answered {greeting[:60]!r}" if greeting else "it did not answer"
                raise CheckError(
                    BUSY_PORT.format(
                        port=port, where=root, detail=f" ({said}, not as this job's task 0)"
                    )
                )
            report = {**shape, "error": error} if error is not None else shape
            connection.sendall(json.dumps(report).encode() + b"\n")
            if error is not None:
                return
            verdict = _line(connection, deadline - time.monotonic() + ANSWER_SECONDS)
        if verdict == "ok":
            return
        raise CheckError(verdict or "task 0 closed the connection without an answer")
    if error is None:
        raise CheckError(
            f"task 0 did not answer on {root}:{port} within {timeout:g} s (--check-timeout): "
            f"see task 0's error, or {FIX}"
        )
