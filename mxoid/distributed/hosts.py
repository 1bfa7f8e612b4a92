"""The hosts of a multi-host job: the host file, where each process runs, SSH, the checks.

A host file has one host a line, ``HOST`` or ``HOST:SSH_PORT`` (dmlc-tracker's
format; a trailing ``slots=N`` is accepted and ignored), blank lines and ``#``
comments ignored. Every process of a host runs through SSH as
``python -m mxoid.distributed.agent`` (:mod:`mxoid.distributed.agent`), which
starts it in its own process group and ends that group when its SSH
connection closes. Before anything starts, :func:`check_hosts` asks each host
once, without a password prompt and within a bounded time, for its Python,
MXNet and mxoid versions, the launcher's working directory and the host's
address.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shlex
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

__all__ = [
    "CONNECT_TIMEOUT",
    "Host",
    "HostError",
    "Remote",
    "check_hosts",
    "parse_host_file",
    "place",
    "remote_argv",
]

CONNECT_TIMEOUT = 10
"""Seconds SSH may take to connect (``-o ConnectTimeout``)."""
CHECK_TIMEOUT = 30.0
"""Seconds the check of all hosts may take in all."""
SSH_OPTIONS = (
    "-o",
    "BatchMode=yes",  # never a password or host-key prompt: a prompt would hang the job
    "-o",
    f"ConnectTimeout={CONNECT_TIMEOUT}",
    "-o",
    "ServerAliveInterval=5",  # a lost connection ends ssh within 15 s
    "-o",
    "ServerAliveCountMax=3",
)


class HostError(ValueError):
    """A host file that cannot be read, or a host that cannot run the job; says the fix."""


@dataclass(frozen=True)
class Host:
    """One line of a host file: the name SSH connects to, its SSH port, its address."""

    name: str
    ssh_port: Optional[int] = None
    address: str = ""

    def __str__(self) -> str:
        return self.name


@dataclass
class Remote:
    """How a job reaches its hosts.

    Parameters
    ----------
    ssh_command : list of str
        The SSH client's command, before the options, port, host and remote command.
    hosts : list of Host
    scheduler_host : Host
    carried : dict
        The variables each remote process gets beside the ps-lite ones (``--env``).
    """

    ssh_command: List[str]
    hosts: List[Host]
    scheduler_host: Host
    carried: Dict[str, str] = field(default_factory=dict)


def parse_host_file(path: str) -> List[Host]:
    """Read a host file; return its hosts, in order, each with its IPv4 address.

    Raises
    ------
    HostError
        A line that is not ``HOST`` or ``HOST:PORT``, a name that does not
        resolve, or no host at all.
    """
    try:
        with open(path) as lines:
            text = lines.read()
    except OSError as error:
        raise HostError(f"cannot read the host file {path!r}: {error.strerror}") from None
    hosts = []
    for number, line in enumerate(text.splitlines(), 1):
        words = line.split("#", 1)[0].split()
        words = [word for word in words if not word.startswith("slots=")]
        if not words:
            continue
        where = f"{path}, line {number}"
        if len(words) > 1:
            raise HostError(f"{where}: one host a line, HOST or HOST:SSH_PORT, not {line!r}")
        name, colon, port = words[0].partition(":")
        if not name or colon and not port.isdigit():
            raise HostError(f"{where}: {words[0]!r} is not HOST or HOST:SSH_PORT")
        hosts.append(Host(name, int(port) if port else None, _address(name, where)))
    if not hosts:
        raise HostError(f"the host file {path!r} names no host")
    return hosts


def _address(name: str, where: str) -> str:
    """Return the IPv4 address of ``name``: ps-lite binds it (it cannot bind a host name)."""
    user_free = name.rsplit("@", 1)[-1]
    try:
        return str(ipaddress.IPv4Address(user_free))
    except ValueError:
        pass
    try:
        return socket.gethostbyname(user_free)
    except OSError as error:
        raise HostError(
            f"{where}: cannot resolve {user_free!r} ({error}); write the host's address instead"
        ) from None


def place(hosts: Sequence[Host], count: int) -> List[Host]:
    """Return the hosts of ``count`` processes of one role: process i on host i modulo them."""
    return [hosts[index % len(hosts)] for index in range(count)]


def remote_argv(
    ssh_command: Sequence[str], host: Host, environment: Dict[str, str], argv: Sequence[str]
) -> List[str]:
    """Return the local command that runs ``argv`` on ``host`` with ``environment``, by SSH.

    The remote command is one line for the remote user's shell: ``env`` and
    the variables (no ``export``: csh has none), then ``argv``, every word
    quoted with :func:`shlex.quote`.
    """
    variables = [f"{name}={value}" for name, value in sorted(environment.items())]
    words = (["env", *variables] if variables else []) + list(argv)
    port = ["-p", str(host.ssh_port)] if host.ssh_port else []
    return [*ssh_command, *SSH_OPTIONS, *port, host.name, " ".join(map(shlex.quote, words))]


def local_facts() -> Dict[str, object]:
    """Return what every host must share with this one: the Python, MXNet, mxoid versions."""
    from .agent import facts

    return {key: value for key, value in facts().items() if key in ("python", "mxnet", "mxoid")}


def check_hosts(
    ssh_command: Sequence[str], hosts: Sequence[Host], environment: Dict[str, str]
) -> None:
    """Ask each host once, all at the same time, whether it can run the job.

    Each must answer through SSH without a prompt within :data:`CHECK_TIMEOUT`
    seconds, run this Python (the same path) with the same Python, MXNet and
    mxoid versions, have the launcher's working directory, and be able to
    bind its address.

    Raises
    ------
    HostError
        For the first host that cannot, naming it and the fix.
    """
    here = local_facts()
    command = [sys.executable, "-m", "mxoid.distributed.agent", "--check", os.getcwd()]
    checks = {}
    for host in dict.fromkeys(hosts):
        argv = remote_argv(ssh_command, host, environment, [*command, host.address])
        try:
            checks[host] = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        except OSError as error:
            raise HostError(f"cannot run the SSH command {argv[0]!r}: {error}") from None
    deadline = time.monotonic() + CHECK_TIMEOUT
    try:
        for host, check in checks.items():
            try:
                out, err = check.communicate(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise HostError(
                    f"host {host}: no answer through SSH within {CHECK_TIMEOUT:g} s; check that "
                    f"it is up and that 'ssh {host} true' returns at once"
                ) from None
            _judge(host, check.returncode, out.decode(errors="replace"), err, here)
    finally:
        for check in checks.values():
            if check.poll() is None:
                os.killpg(check.pid, 9)
                check.wait()


def _judge(host: Host, status: int, out: str, err: bytes, here: Dict[str, object]) -> None:
    """Raise HostError when the answer of ``host`` to the check says it cannot run the job."""
    said = " ".join(err.decode(errors="replace").split())[-400:]
    port = f"-p {host.ssh_port} " if host.ssh_port else ""
    if status == 255 and "Connection refused" in said:
        raise HostError(
            f"host {host}: cannot log in through SSH without a prompt: nothing accepts SSH "
            f"connections on port {host.ssh_port or 22} there ({said}). Fix: start sshd there, or "
            "write the port its sshd listens on in the host file (HOST:PORT); check with "
            f"'ssh {port}{host.name} true' (then, if it asks for a password: ssh-copy-id "
            f"{host.name} with that port)"
        )
    if status == 255:
        raise HostError(
            f"host {host}: cannot log in through SSH without a prompt ({said or 'ssh failed'}). "
            f"Fix: set up key authentication (ssh-copy-id {port}{host.name}), accept its host "
            f"key once (ssh {port}{host.name} true), or give the right --ssh-command"
        )
    if status == 127 or "No such file or directory" in said and not out:
        raise HostError(
            f"host {host}: there is no {sys.executable} ({said}). Fix: install the same Python, "
            "MXNet and mxoid at the same path on every host (a shared file system or the same "
            "virtual environment path)"
        )
    try:
        answer = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise HostError(
            f"host {host}: {sys.executable} cannot run mxoid's agent there (status {status}: "
            f"{said or 'no output'}). Fix: install mxoid there, or carry PYTHONPATH with "
            "--env PYTHONPATH"
        ) from None
    for key, value in here.items():
        if answer.get(key) != value:
            raise HostError(
                f"host {host} runs {key} {answer.get(key)} where this host runs {value}. Fix: "
                f"install {key} {value} there"
            )
    if not answer.get("cwd"):
        raise HostError(
            f"host {host} has no directory {os.getcwd()}: the job runs in the launcher's "
            "working directory on every host. Fix: use a shared file system, or create it there"
        )
    if answer.get("bind"):
        raise HostError(
            f"host {host} cannot use the address {host.address} ({answer['bind']}): ps-lite "
            "binds it. Fix: write in the host file the address the host has on the network "
            "the job uses"
        )
