"""One launched process: its output, its exit status and what /proc tells of it by its PID.

A process of another host is the local ``ssh`` that runs it there under
:mod:`mxoid.distributed.agent`: signals reach it as lines on the agent's
standard input, and closing that input ends it.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import time
from typing import TYPE_CHECKING, Dict, List, Optional

if TYPE_CHECKING:
    from .hosts import Host

__all__ = ["EXEC_CODE", "HOST", "SCHEDULER_CODE", "LaunchedProcess", "free_port"]

HOST = "127.0.0.1"
_ERROR_LINE = re.compile(
    r"^(?:[\w.]+(?:Error|Exception|Exit|Interrupt)\b.*|mxoid: worker of rank.*)$"
)
HEARTBEAT_EVERY = 2.0
"""Seconds between the launcher's heartbeats to each agent."""

# The scheduler only needs libmxnet's ps-lite: loading the library with ctypes
# takes 0.2 s where ``import mxnet`` takes 3 s of CPU, on the launch's critical
# path. It does what mxnet/kvstore/kvstore_server.py does at import.
SCHEDULER_CODE = """\
import ctypes, importlib.util, os
try:
    path = os.environ.get("MXNET_LIBRARY_PATH") or os.path.join(
        importlib.util.find_spec("mxnet").submodule_search_locations[0], "libmxnet.so")
    lib = ctypes.CDLL(path)
except (OSError, AttributeError, TypeError):
    import mxnet  # serves inside the import
    raise SystemExit(0)
lib.MXGetLastError.restype = ctypes.c_char_p
handle = ctypes.c_void_p()
controller = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)(
    lambda *args: None)
if (lib.MXKVStoreCreate(b"dist", ctypes.byref(handle)) != 0
        or lib.MXKVStoreRunServer(handle, controller, None) != 0):
    raise SystemExit("scheduler: " + lib.MXGetLastError().decode(errors="replace"))
"""

# Every child starts as this small program (``python -S -c EXEC_CODE launcher-pid
# command...``), which asks Linux to SIGKILL it when the launcher dies
# (PR_SET_PDEATHSIG survives exec), then becomes the command. Doing this in the
# child after exec rather than in a preexec_fn keeps launch() safe in threaded
# programs (a test runner with MXNet's engine threads).
EXEC_CODE = """\
import ctypes, os, signal, sys
try:
    ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
except (OSError, AttributeError):  # not Linux: no parent-death signal
    pass
if os.getppid() != int(sys.argv[1]):  # the launcher died before prctl
    os._exit(1)
try:
    os.execvp(sys.argv[2], sys.argv[2:])
except OSError as error:
    sys.exit(f"mxoid launch: cannot run {sys.argv[2]!r}: {error}")
"""


class LaunchedProcess:
    """One started process, with its output buffers.

    Parameters
    ----------
    role : str
        ``'scheduler'``, ``'server'`` or ``'worker'``.
    index : int
        Launch index among the processes of its role (not the rank).
    popen : subprocess.Popen
        The process, or for a process of another host, its ``ssh``.
    host : Host, optional
        The other host it runs on.
    """

    def __init__(
        self, role: str, index: int, popen: subprocess.Popen, host: Optional[Host] = None
    ) -> None:
        self.role = role
        self.index = index
        self.popen = popen
        self.host = host
        self.label = role if role == "scheduler" else f"{role} {index}"
        if host is not None:
            self.label += f" on {host}"
        self.partial: Dict[int, bytes] = {}  # per fd (1, 2): the unfinished last line
        self.held: Dict[int, bytes] = {}  # per fd: output not shown yet (see start_scheduler)
        self.errors: List[str] = []  # its error lines on stderr (an exception's last line)
        self.remote_ticks = 0  # the CPU ticks its agent reported
        self.listening_port: Optional[int] = None  # a remote scheduler's, once it listens
        self.remote_code: Optional[int] = None  # a remote command's own return code, as told
        self.heartbeat_sent = 0.0

    def heard_rank(self, rank: int) -> str:
        """Label a worker's output with ``rank`` from now on; return a note when it changed.

        Until a worker tells its rank its lines carry its launch index, which
        on one host is its rank too (see :func:`ascending_free_ports`).
        """
        if self.role != "worker" or rank == self.index:
            return ""
        before = self.label
        self.label = f"worker {rank}" + (f" on {self.host}" if self.host is not None else "")
        ssh = "ssh " if self.host is not None else ""
        return f"{before} ({ssh}pid {self.pid}) has rank {rank}: its lines read [{self.label}] now"

    @property
    def pid(self) -> int:
        """The process id (also its process group id)."""
        return self.popen.pid

    def running(self) -> bool:
        """Return True until the process has ended (and then it is reaped)."""
        return self.popen.poll() is None

    def cpu_ticks(self) -> int:
        """CPU clock ticks it used so far (on another host: as its agent last said)."""
        return _cpu_ticks(self.pid) + self.remote_ticks

    def _tell(self, data: bytes) -> None:
        """Write ``data`` to the agent of a remote process; lost when the pipe is full or gone."""
        stdin = self.popen.stdin
        if stdin is None or stdin.closed:
            return
        try:
            os.write(stdin.fileno(), data)
        except (BlockingIOError, BrokenPipeError, OSError):
            pass

    def heartbeat(self) -> None:
        """Tell the agent of a remote process that the launcher lives (every few seconds)."""
        if self.host is not None and time.monotonic() - self.heartbeat_sent > HEARTBEAT_EVERY:
            self.heartbeat_sent = time.monotonic()
            self._tell(b"\n")

    def deliver(self, number: int) -> None:
        """Send signal ``number`` to the process's group, here or through its agent."""
        if not self.running():
            return
        if self.host is not None:
            self._tell(f"signal {int(number)}\n".encode())
            return
        try:
            os.killpg(self.pid, number)
        except ProcessLookupError:
            pass

    def terminate(self) -> None:
        """SIGTERM here; on another host, close its agent's input (it ends the group)."""
        if self.host is None or self.popen.stdin is None:
            self.deliver(signal.SIGTERM)
        elif not self.popen.stdin.closed:
            try:
                self.popen.stdin.close()
            except OSError:
                pass

    def kill(self) -> None:
        """SIGKILL its process group (on another host: ssh's, which closes the connection)."""
        if self.running():
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def describe_exit(self) -> str:
        """How it ended, in words: ``'worker 1 (pid 42) was killed by SIGKILL'``."""
        code = self.popen.returncode
        what = f"{self.label} ({'ssh ' if self.host else ''}pid {self.pid})"
        if code is not None and code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            if self.host is not None:
                return f"the SSH session of {what} was killed by {name}"
            return f"{what} was killed by {name}"
        said = self.error_summary()
        if self.host is not None and code == 255:
            return f"the SSH connection of {what} was lost or refused" + (
                f": {said}" if said else ""
            )
        if (
            self.host is not None
            and code is not None
            and code > 128
            and (self.remote_code or -1) < 0
        ):
            try:
                return f"{what} was killed by {signal.Signals(code - 128).name} on {self.host}"
            except ValueError:
                pass
        where = f" on {self.host}" if self.host is not None and self.remote_code is not None else ""
        return f"{what} exited with status {code}{where}" + (f": {said}" if said and code else "")

    def error_summary(self) -> str:
        """Return the error the process reported last: an exception's message, preferably."""
        exceptions = [line for line in self.errors if not line.startswith("mxoid:")]
        return (exceptions or self.errors or [""])[-1][:300]

    def exit_status(self) -> int:
        """Its exit status as a shell reports it: 128 + N when killed by signal N."""
        code = self.popen.returncode
        return 128 - code if code < 0 else code

    def job_status(self) -> int:
        """Return the job's status when this process ends it: 1 for a lost SSH connection."""
        return 1 if self.host is not None and self.popen.returncode == 255 else self.exit_status()


def free_port() -> int:
    """Return a TCP port of 127.0.0.1 free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((HOST, 0))
        return probe.getsockname()[1]


def ascending_free_ports(count: int) -> List[int]:
    """Return ``count`` different TCP ports of 127.0.0.1 free right now, in ascending order.

    ps-lite's scheduler ranks the nodes of one host by port, ascending: a
    process given the i-th port through ``PORT`` gets rank i, unless the port
    is taken before it binds (it then binds another, and tells its rank).
    """
    probes = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for probe in probes:
            probe.bind((HOST, 0))
        return sorted(probe.getsockname()[1] for probe in probes)
    finally:
        for probe in probes:
            probe.close()


def _listening(pid: int, port: int) -> bool:
    """Return True when process ``pid`` has a TCP socket listening on ``port`` (from /proc)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as lines:
                next(lines)
                for line in lines:
                    fields = line.split()
                    if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                        inodes.add(f"socket:[{fields[9]}]")
        except OSError:
            continue
    if not inodes:
        return False
    try:
        descriptors = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in descriptors:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") in inodes:
                return True
        except OSError:
            continue
    return False


def _cpu_ticks(pid: int) -> int:
    """User plus system clock ticks used by ``pid`` so far; 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    except (OSError, IndexError, ValueError):
        return 0
