"""The agent that runs one process of a multi-host job on its host, through SSH.

``mxoid launch -H HOSTFILE`` runs every process as::

    ssh HOST env DMLC_...=... python -m mxoid.distributed.agent --cwd DIR -- COMMAND...

The agent starts COMMAND in its own process group (set to die with the agent),
with the launcher's Python's ``bin`` folder first on ``PATH`` (as an activated
virtual environment has it), and passes its output straight through. It reads
its standard input, which is the SSH connection:

- a line ``signal N`` sends signal N to the process group (Ctrl-C and SIGTERM
  to the launcher, passed on to the workers);
- any byte is the launcher's heartbeat; none for ``--heartbeat-timeout``
  seconds (a connection that hangs) ends the process group;
- end of file (the launcher closed it, ssh died, the connection dropped) ends
  the process group: SIGTERM, then SIGKILL after ``--grace`` seconds.

The agent exits with COMMAND's status (128 + N when a signal N ended it), so
ssh does, and first says COMMAND's own return code (``exited -15`` for a
SIGTERM, ``exited 143`` for a clean stop that exits so). Every few seconds
it writes the CPU time of COMMAND on stderr, in a line the launcher reads
and hides (its stall timeout). With ``--scheduler``,
it first finds a free port on ``DMLC_PS_ROOT_URI``, starts COMMAND with it
as ``DMLC_PS_ROOT_PORT`` and says so when COMMAND listens there (retrying
another port when COMMAND cannot bind it). ``--check DIR ADDRESS`` prints the
facts :func:`mxoid.distributed.hosts.check_hosts` compares, as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from typing import Dict, List, Optional, Sequence

from .launched import EXEC_CODE, SCHEDULER_CODE, _cpu_ticks, _listening

__all__ = ["AGENT_TAG", "LAUNCHER_VARIABLE", "facts", "main", "parse_agent_line"]

AGENT_TAG = "\x1emxoid-agent "
"""The start of the agent's lines for the launcher, on stderr (hidden from the output)."""
LAUNCHER_VARIABLE = "MXOID_LAUNCHER"
"""Set to ``1`` in the workers ``mxoid launch`` starts: they tell it their rank with a line."""
TICKS_EVERY = 5.0
PORT_ATTEMPTS = 5
LISTEN_SECONDS = 120.0


def facts(directory: str = "", address: str = "") -> Dict[str, object]:
    """Return what the launcher compares between hosts.

    That is: the Python, MXNet and mxoid versions, whether ``directory``
    exists, and why ``address`` cannot be bound (empty when it can).
    """
    import importlib.metadata

    versions: Dict[str, Optional[str]] = {}
    for package in ("mxnet", "mxoid"):  # as installed (mxoid's: the root's __version__)
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = None
    bind = ""
    if address:
        try:
            with socket.socket() as probe:
                probe.bind((address, 0))
        except OSError as error:
            bind = str(error)
    return {
        "python": sys.version.split()[0],
        "mxnet": versions["mxnet"],
        "mxoid": versions["mxoid"],
        "cwd": bool(directory) and os.path.isdir(directory),
        "bind": bind,
    }


def parse_agent_line(line: str) -> Optional[List[str]]:
    """Return the words of an agent's line for the launcher (``['ticks', '42']``), else None."""
    return line[len(AGENT_TAG) :].split() if line.startswith(AGENT_TAG) else None


def _say(*words: object) -> None:
    sys.stderr.write(AGENT_TAG + " ".join(map(str, words)) + "\n")
    sys.stderr.flush()


def _note(message: str) -> None:
    sys.stderr.write(f"mxoid agent: {message}\n")
    sys.stderr.flush()


class Agent:
    """One command in its own process group, ended when the connection ends."""

    def __init__(self, command: Sequence[str], grace: float, heartbeat_timeout: float) -> None:
        self.command = list(command)
        self.grace = grace
        self.heartbeat_timeout = heartbeat_timeout
        self.child: Optional[subprocess.Popen] = None
        self.heard = time.monotonic()
        self.pending = b""
        self.closed = False  # end of file on stdin
        self.ending = False  # the agent ends the command (it did not die by itself)

    def start(self, env: Dict[str, str]) -> subprocess.Popen:
        """Start the command in its own session, dying with this agent."""
        wrapped = [sys.executable, "-S", "-c", EXEC_CODE, str(os.getpid()), *self.command]
        self.child = subprocess.Popen(
            wrapped, env=env, stdin=subprocess.DEVNULL, start_new_session=True
        )
        return self.child

    def listen(self, wait: float) -> None:
        """Read stdin for up to ``wait`` seconds: heartbeats, ``signal N`` lines, end of file."""
        if self.closed:
            time.sleep(wait)
            return
        ready, _, _ = select.select([0], [], [], wait)
        if not ready:
            return
        chunk = os.read(0, 4096)
        if not chunk:
            self.closed = True
            return
        self.heard = time.monotonic()
        lines = (self.pending + chunk).split(b"\n")
        self.pending = lines.pop()
        for line in lines:
            words = line.split()
            if len(words) == 2 and words[0] == b"signal" and words[1].isdigit():
                self.signal_group(int(words[1]))

    def signal_group(self, number: int) -> None:
        """Send ``number`` to the command's process group while the command is not reaped."""
        if self.child is not None and self.child.returncode is None:
            try:
                os.killpg(self.child.pid, number)
            except ProcessLookupError:
                pass

    def lost(self) -> Optional[str]:
        """Why the launcher is gone (end of file, no heartbeat), or None."""
        if self.closed:
            return "the connection to the launcher closed"
        silent = time.monotonic() - self.heard
        if self.heartbeat_timeout and silent > self.heartbeat_timeout:
            return f"no word from the launcher for {silent:.0f} s"
        return None

    def exited(self) -> bool:
        """Return True once the command has ended; then kill what is left of its group, reap it."""
        assert self.child is not None
        try:
            ended = os.waitid(os.P_PID, self.child.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            ended = True
        if not ended:
            return False
        self.signal_group(signal.SIGKILL)  # what it left in its group, before the group id frees
        self.child.wait()
        return True

    def end(self, reason: str) -> None:
        """SIGTERM the process group, SIGKILL it after the grace period, reap the command."""
        self.ending = True
        _note(f"{reason}; ending its process group ({self.child.pid})")
        for number, wait in ((signal.SIGTERM, self.grace), (signal.SIGKILL, 5.0)):
            self.signal_group(number)
            limit = time.monotonic() + wait
            while time.monotonic() < limit:
                if self.exited():
                    return
                time.sleep(0.05)

    def supervise(self) -> int:
        """Run until the command ends or the launcher is lost; return the command's status."""
        last_ticks = 0.0
        while not self.exited():
            reason = self.lost()
            if reason is not None:
                self.end(reason)
                break
            if time.monotonic() - last_ticks > TICKS_EVERY:
                last_ticks = time.monotonic()
                _say("ticks", _cpu_ticks(self.child.pid))
            self.listen(0.2)
        return status_of(self.child.returncode)


def status_of(code: int) -> int:
    """Return an exit status as a shell reports it: 128 + N when killed by signal N."""
    return 128 - code if code < 0 else code


def start_scheduler(agent: Agent, env: Dict[str, str]) -> bool:
    """Start the scheduler on a free port of ``DMLC_PS_ROOT_URI``; True once it listens."""
    address = env["DMLC_PS_ROOT_URI"]
    for _ in range(PORT_ATTEMPTS):
        with socket.socket() as probe:
            probe.bind((address, 0))
            port = probe.getsockname()[1]
        child = agent.start({**env, "DMLC_PS_ROOT_PORT": str(port)})
        limit = time.monotonic() + LISTEN_SECONDS
        while time.monotonic() < limit and agent.lost() is None:
            if _listening(child.pid, port):
                _say("listening", port)
                return True
            if child.poll() is not None:
                break
            agent.listen(0.1)
        if child.poll() is None:
            agent.end(agent.lost() or "the scheduler did not listen in time")
            return False
        _note(f"the scheduler could not bind port {port}; trying another port")
    return False


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of ``python -m mxoid.distributed.agent``; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    command: List[str] = []
    if "--" in argv:
        argv, command = argv[: argv.index("--")], argv[argv.index("--") + 1 :]
    parser = argparse.ArgumentParser(prog="python -m mxoid.distributed.agent")
    parser.add_argument("--check", nargs=2, metavar=("DIR", "ADDRESS"))
    parser.add_argument("--cwd", default=".")
    parser.add_argument("--grace", type=float, default=2.0)
    parser.add_argument("--heartbeat-timeout", type=float, default=30.0)
    parser.add_argument("--scheduler", action="store_true")
    args = parser.parse_args(argv)
    if args.check:
        print(json.dumps(facts(*args.check)))
        return 0
    if args.scheduler and not command:
        command = [sys.executable, "-c", SCHEDULER_CODE]
    if not command:
        parser.error("give the command after '--'")
    os.chdir(args.cwd)
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
    agent = Agent(command, args.grace, args.heartbeat_timeout)
    for number in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(number, lambda number, frame: setattr(agent, "closed", True))
    if args.scheduler:
        if not start_scheduler(agent, env):
            return 1 if agent.child is None else status_of(agent.child.returncode or 1)
    else:
        agent.start(env)
    status = agent.supervise()
    _say("exited", agent.child.returncode)  # the launcher tells exit(143) from a SIGTERM
    if agent.child is not None and agent.child.returncode < 0 and not agent.ending:
        name = signal.Signals(-agent.child.returncode).name
        _note(f"{command[0]} (pid {agent.child.pid}) was killed by {name}")
    return status


if __name__ == "__main__":
    sys.exit(main())
