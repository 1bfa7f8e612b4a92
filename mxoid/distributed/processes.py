"""The processes of one ``mxoid launch`` job: starting them, their output, stopping them.

:class:`Job` starts the scheduler (on a free port, found again when taken),
the servers and the workers, each in its own process group and set to die
with the launcher; copies their output line by line with a prefix; decides
when the job has failed, stalled or finished; and ends every process it
started, and only those (their output: :class:`~mxoid.distributed.output.JobOutput`).
:func:`mxoid.distributed.launch.launch` drives it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import BinaryIO, Dict, List, Optional, Sequence, Tuple

from .agent import LAUNCHER_VARIABLE
from .hosts import Host, Remote, remote_argv
from .launched import (
    EXEC_CODE,
    HOST,
    SCHEDULER_CODE,
    LaunchedProcess,
    _listening,
    ascending_free_ports,
    free_port,
)
from .output import JobOutput

__all__ = [
    "DEFAULT_STALL_TIMEOUT",
    "EXIT_FAILURE",
    "EXIT_TIMEOUT",
    "SCHEDULER_START_SECONDS",
    "Job",
    "LaunchedProcess",
    "free_port",
]

PORT_ATTEMPTS = 5
SCHEDULER_START_SECONDS = 120.0

EXIT_TIMEOUT = 124
EXIT_FAILURE = 1
DEFAULT_STALL_TIMEOUT = 300.0
"""Seconds without output and CPU use after which a job is stopped, unless told otherwise."""
STOP_WAIT = 60.0
"""Seconds the other workers get to stop cleanly once one stopped on a signal (it saves a
checkpoint, flushes logs) before they are treated as stuck."""
LONE_EXIT_WAIT = 30.0
"""Seconds the other workers may go on after one exited with status 0: workers end together
(ps-lite's finalize barrier), so a worker that ended alone left the others waiting for it."""


class Job:
    """The processes of one launch, their output, and the decision to stop them.

    With ``remote`` (:class:`mxoid.distributed.hosts.Remote`), every process runs on a
    host of its own through SSH, under :mod:`mxoid.distributed.agent`.
    """

    def __init__(
        self,
        num_workers: int,
        num_servers: int,
        grace: float,
        stdout: BinaryIO,
        stderr: BinaryIO,
        remote: Optional[Remote] = None,
    ) -> None:
        self.num_workers = num_workers
        self.num_servers = num_servers
        self.grace = grace
        self.remote = remote
        self.output = JobOutput(stdout, stderr)
        self.processes: List[LaunchedProcess] = []
        self.last_ticks = 0
        self.node_ports: Dict[str, List[int]] = {}  # per role: the PORT of each index here
        self.signals: List[int] = []  # signals the launcher received, in order

    @property
    def stop_signal(self) -> Optional[int]:
        """The first signal the launcher received, if any."""
        return self.signals[0] if self.signals else None

    # ------------------------------------------------------------ starting
    def environment(
        self, port: Optional[int], role: str, host: Optional[Host] = None, index: int = 0
    ) -> Dict[str, str]:
        """Return the environment of a process of ``role``: with the ps-lite variables.

        Here: this process's environment; on another host: only the variables
        the launcher carries there (``--env``).
        """
        if host is None or self.remote is None:
            env, root, node = dict(os.environ), HOST, HOST
        else:
            env = dict(self.remote.carried)
            root, node = self.remote.scheduler_host.address, host.address
        env.update(
            DMLC_PS_ROOT_URI=root,
            DMLC_NUM_SERVER=str(self.num_servers),
            DMLC_NUM_WORKER=str(self.num_workers),
            DMLC_NODE_HOST=node,
            PYTHONUNBUFFERED="1",
        )
        if port is not None:
            env["DMLC_PS_ROOT_PORT"] = str(port)
        env.pop("DMLC_ROLE", None)
        if role != "server":  # servers set their role once mxoid is imported
            env["DMLC_ROLE"] = role
        if role == "worker":  # it tells its rank (mxoid.distributed.tell_launcher_rank)
            env[LAUNCHER_VARIABLE] = "1"
        if host is None and role != "scheduler":  # ranks in launch order (ascending ports)
            count = self.num_workers if role == "worker" else self.num_servers
            if role not in self.node_ports:  # drawn once a role: each index takes its own
                self.node_ports[role] = ascending_free_ports(count)
            env["PORT"] = str(self.node_ports[role][index])
        return env

    def start(
        self,
        role: str,
        index: int,
        command: Sequence[str],
        port: Optional[int],
        show_output: bool = True,
        host: Optional[Host] = None,
    ) -> LaunchedProcess:
        """Start ``command`` as a child in its own process group, dying with the launcher.

        With ``host``, the child is ``ssh`` running the agent there, which runs
        ``command`` (without one, the agent runs the scheduler). With
        ``show_output=False`` its output is held back until
        :meth:`show_held_output`.
        """
        env = self.environment(port, role, host, index)
        if host is not None and self.remote is not None:
            agent = [sys.executable, "-m", "mxoid.distributed.agent", "--cwd", os.getcwd()]
            agent += ["--grace", f"{self.grace / 2:g}"]
            agent += ["--", *command] if command else ["--scheduler"]
            command = remote_argv(self.remote.ssh_command, host, env, agent)
            env = dict(os.environ)  # ssh's own
        wrapped = [sys.executable, "-S", "-c", EXEC_CODE, str(os.getpid()), *command]
        popen = subprocess.Popen(
            wrapped,
            env=env,
            stdin=subprocess.DEVNULL if host is None else subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        if popen.stdin is not None:
            os.set_blocking(popen.stdin.fileno(), False)
        process = LaunchedProcess(role, index, popen, host)
        self.processes.append(process)
        self.output.register(process, show_output)
        return process

    def start_scheduler(self, deadline: float) -> Tuple[Optional[int], str]:
        """Start the scheduler on a free port; return the port, or None and why not."""
        if self.remote is not None:
            return self._start_remote_scheduler(deadline)
        command = [sys.executable, "-c", SCHEDULER_CODE]
        for attempt in range(PORT_ATTEMPTS):
            port = free_port()
            scheduler = self.start("scheduler", 0, command, port, show_output=False)
            limit = min(deadline, time.monotonic() + SCHEDULER_START_SECONDS)
            while time.monotonic() < limit and self.stop_signal is None:
                self.pump(0.1)
                if _listening(scheduler.pid, port):
                    self.output.show_held_output(scheduler)
                    return port, ""
                if not scheduler.running():
                    break
            if scheduler.running():
                return None, "the scheduler did not start listening in time"
            self._read_last_words()
            self.forget(scheduler)
            if attempt == PORT_ATTEMPTS - 1:
                self.output.show_held_output(scheduler)
                return None, f"the scheduler could not start: {scheduler.describe_exit()}"
            self.note(f"the scheduler could not bind port {port}; trying another port")
        return None, "unreachable"

    def _start_remote_scheduler(self, deadline: float) -> Tuple[Optional[int], str]:
        """Start the scheduler on its host; its agent finds the port and tells it."""
        assert self.remote is not None
        host = self.remote.scheduler_host
        scheduler = self.start("scheduler", 0, [], None, show_output=False, host=host)
        limit = min(deadline, time.monotonic() + SCHEDULER_START_SECONDS)
        while time.monotonic() < limit and self.stop_signal is None:
            self.pump(0.1)
            if scheduler.listening_port is not None:
                self.output.show_held_output(scheduler)
                return scheduler.listening_port, ""
            if not scheduler.running():
                break
        if scheduler.running():
            return None, f"the scheduler did not start listening on {host} in time"
        self._read_last_words()
        self.output.show_held_output(scheduler)
        return None, f"the scheduler could not start: {scheduler.describe_exit()}"

    def _read_last_words(self) -> None:
        """Read what the processes said before they died, for up to a second."""
        self.output.read_for(1.0, self.pump)

    def pump(self, wait: float) -> None:
        """Keep remote agents told that the launcher lives; copy output for up to ``wait`` s."""
        for process in self.processes:
            process.heartbeat()
        self.output.pump(wait)

    def note(self, message: str) -> None:
        """Write one line of the launcher's own to stderr."""
        self.output.note(message)

    def forget(self, process: LaunchedProcess) -> None:
        """Stop reading an ended process and drop it from the job."""
        self.output.forget(process)
        self.processes.remove(process)

    # ------------------------------------------------------------- running
    def stalled(self, stall_timeout: Optional[float]) -> bool:
        """No output and no CPU time used by any process for ``stall_timeout`` seconds."""
        if stall_timeout is None:
            return False
        ticks = sum(p.cpu_ticks() for p in self.processes if p.running())
        if ticks != self.last_ticks:
            self.last_ticks = ticks
            self.output.last_activity = time.monotonic()
        return time.monotonic() - self.output.last_activity > stall_timeout

    def wait(self, deadline: Optional[float], stall_timeout: Optional[float]) -> Tuple[int, str]:
        """Run until the workers finish or something fails; return (status, reason).

        A scheduler or server exits with status 0 only after every worker
        reached ps-lite's finalize barrier, so it is no failure: the workers
        are ending too. A signal to the launcher (:attr:`signals`) is passed
        on to every worker, which stops cleanly; a third one ends the job at
        once. A worker that stopped on a signal (status 128 + N) gives the
        others :data:`STOP_WAIT` seconds to stop as well.
        """
        workers = [p for p in self.processes if p.role == "worker"]
        others = [p for p in self.processes if p.role != "worker"]
        forwarded = 0
        stopping: Optional[Tuple[float, LaunchedProcess]] = None
        lone_exit: Optional[Tuple[float, LaunchedProcess]] = None
        while True:
            self.pump(0.1)
            while forwarded < len(self.signals):
                number = self.signals[forwarded]
                forwarded += 1
                name = signal.Signals(number).name
                if forwarded >= 3:
                    return 128 + number, f"the launcher received {name} a third time"
                self.note(
                    f"received {name}: passing it on to the workers, which stop cleanly "
                    "(send it twice more to end everything at once)"
                )
                self.signal_workers(number)
            for process in workers:
                if process.running() or process.popen.returncode == 0:
                    continue
                status = process.job_status()
                if status - 128 in (signal.SIGINT, signal.SIGTERM):
                    stopping = stopping or (time.monotonic(), process)
                else:
                    return status, process.describe_exit()
            running = [p for p in workers if p.running()]
            if not running:
                if stopping is not None:
                    first = stopping[1]
                    return first.exit_status(), f"the workers stopped: {first.describe_exit()}"
                return 0, ""
            if stopping is not None and time.monotonic() - stopping[0] > STOP_WAIT:
                return stopping[1].exit_status(), (
                    f"{stopping[1].describe_exit()}; the other workers did not stop within "
                    f"{STOP_WAIT:g} s"
                )
            ended = [p for p in workers if not p.running() and p.popen.returncode == 0]
            if ended and lone_exit is None:
                lone_exit = (time.monotonic(), ended[0])
            if lone_exit is not None and time.monotonic() - lone_exit[0] > LONE_EXIT_WAIT:
                return EXIT_FAILURE, (
                    f"{lone_exit[1].label} (pid {lone_exit[1].pid}) exited with status 0, but "
                    f"{', '.join(p.label for p in running)} kept running {LONE_EXIT_WAIT:g} s "
                    "later: workers end together, so the others are waiting for it (did it stop "
                    "early, e.g. with sys.exit or os._exit in the middle of training?)"
                )
            for process in others:
                if not process.running() and process.popen.returncode != 0:
                    return EXIT_FAILURE, f"{process.describe_exit()} while workers were running"
            if deadline is not None and time.monotonic() > deadline:
                return EXIT_TIMEOUT, "timed out (--timeout)" + self._errors_so_far()
            if self.stalled(stall_timeout):
                return EXIT_TIMEOUT, (
                    f"stalled: no output and no CPU time used for "
                    f"{stall_timeout:g} s (--stall-timeout)" + self._errors_so_far()
                )

    def signal_workers(self, number: int) -> None:
        """Send signal ``number`` to the process group of every running worker."""
        for process in self.processes:
            if process.role == "worker":
                process.deliver(number)

    def _errors_so_far(self) -> str:
        said = [f"{p.label}: {p.error_summary()}" for p in self.processes if p.error_summary()]
        return f"; errors reported: {'; '.join(said)}" if said else ""

    def finish(self) -> List[LaunchedProcess]:
        """Let the processes end within the grace period, then SIGTERM, then SIGKILL.

        The first wait lets workers failing together report their errors, and
        servers end by themselves after the workers. SIGKILL follows SIGTERM
        after the grace period: a process blocked on a dead peer never runs
        its SIGTERM handler. Only the process groups of
        children not yet reaped are signalled, so the group ids cannot belong
        to anybody else. Returns the processes signalled.
        """
        signalled: List[LaunchedProcess] = []
        for stage, wait in ((None, self.grace), ("terminate", self.grace), ("kill", 5.0)):
            for process in self.processes:
                if stage is not None and process.running():
                    getattr(process, stage)()
                    if process not in signalled:
                        signalled.append(process)
            limit = time.monotonic() + wait
            while any(p.running() for p in self.processes) and time.monotonic() < limit:
                self.pump(0.05)
            if not any(p.running() for p in self.processes):
                break
        self.drain()
        return signalled

    def drain(self) -> None:
        """Copy the output left in the pipes, for at most a second."""
        self.output.read_for(1.0, self.pump)
        self.output.close(self.processes)

    def kill_remaining(self) -> None:
        """SIGKILL the process groups of the children still running, and reap them."""
        for process in self.processes:
            process.kill()
            process.popen.wait()
            if process.popen.stdin is not None:
                process.popen.stdin.close()
