"""One launched process: its output, its exit status and what /proc tells of it by its PID."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
from typing import Dict, List

__all__ = ["HOST", "LaunchedProcess", "free_port"]

HOST = "127.0.0.1"
_ERROR_LINE = re.compile(
    r"^(?:[\w.]+(?:Error|Exception|Exit|Interrupt)\b.*|mxoid: worker of rank.*)$"
)


class LaunchedProcess:
    """One started process, with its output buffers.

    Parameters
    ----------
    role : str
        ``'scheduler'``, ``'server'`` or ``'worker'``.
    index : int
        Launch index among the processes of its role (not the rank).
    popen : subprocess.Popen
    """

    def __init__(self, role: str, index: int, popen: subprocess.Popen) -> None:
        self.role = role
        self.index = index
        self.popen = popen
        self.label = role if role == "scheduler" else f"{role} {index}"
        self.partial: Dict[int, bytes] = {}  # per fd (1, 2): the unfinished last line
        self.held: Dict[int, bytes] = {}  # per fd: output not shown yet (see start_scheduler)
        self.errors: List[str] = []  # its error lines on stderr (an exception's last line)

    @property
    def pid(self) -> int:
        """The process id (also its process group id)."""
        return self.popen.pid

    def running(self) -> bool:
        """Return True until the process has ended (and then it is reaped)."""
        return self.popen.poll() is None

    def describe_exit(self) -> str:
        """How it ended, in words: ``'worker 1 (pid 42) was killed by SIGKILL'``."""
        code = self.popen.returncode
        if code is not None and code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            return f"{self.label} (pid {self.pid}) was killed by {name}"
        said = self.error_summary()
        return f"{self.label} (pid {self.pid}) exited with status {code}" + (
            f": {said}" if said and code else ""
        )

    def error_summary(self) -> str:
        """Return the error the process reported last: an exception's message, preferably."""
        exceptions = [line for line in self.errors if not line.startswith("mxoid:")]
        return (exceptions or self.errors or [""])[-1][:300]

    def exit_status(self) -> int:
        """Its exit status as a shell reports it: 128 + N when killed by signal N."""
        code = self.popen.returncode
        return 128 - code if code < 0 else code


def free_port() -> int:
    """Return a TCP port of 127.0.0.1 free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((HOST, 0))
        return probe.getsockname()[1]


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
