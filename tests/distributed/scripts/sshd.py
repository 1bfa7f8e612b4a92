"""Stand-in hosts for the multi-host tests: 127.0.0.2 and 127.0.0.3, served by a real sshd.

:func:`stand_in_hosts` starts ``/usr/sbin/sshd`` in the foreground with its own
configuration, host key, client key, port and pid file in a temporary folder
(never as a system service), yields the host file and the ``ssh`` command that
reaches it with key authentication, and stops it (by its pid). When sshd is
missing it installs ``openssh-server`` with apt-get as root; when it cannot,
the tests skip, saying so.
"""

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

ADDRESSES = ("127.0.0.2", "127.0.0.3")
SSHD = "/usr/sbin/sshd"
MARKER = "MXOID_TEST_MARKER"


@dataclass
class StandIns:
    host_file: Path
    ssh_command: str
    port: int
    pid: int


def _sshd_or_skip():
    if os.path.exists(SSHD) and shutil.which("ssh") and shutil.which("ssh-keygen"):
        return
    if os.geteuid() == 0 and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(
            ["apt-get", "install", "-y", "-q", "openssh-server", "openssh-client"],
            capture_output=True,
            env=env,
            timeout=600,
        )
    if not (os.path.exists(SSHD) and shutil.which("ssh") and shutil.which("ssh-keygen")):
        pytest.skip(
            "the multi-host tests need OpenSSH's sshd and ssh (apt-get install openssh-server "
            "openssh-client), which could not be installed here"
        )


def _free_port():
    with socket.socket() as probe:
        probe.bind((ADDRESSES[0], 0))
        return probe.getsockname()[1]


def _answers(port):
    for address in ADDRESSES:
        try:
            with socket.create_connection((address, port), timeout=1) as connection:
                if not connection.recv(64).startswith(b"SSH-"):
                    return False
        except OSError:
            return False
    return True


@contextlib.contextmanager
def stand_in_hosts(folder: Path):
    """Run an sshd on both stand-in addresses for the duration; yield a :class:`StandIns`."""
    _sshd_or_skip()
    folder.mkdir(parents=True, exist_ok=True)
    for key in ("host_key", "client_key"):
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(folder / key)], check=True
        )
    shutil.copy(folder / "client_key.pub", folder / "authorized_keys")
    port = _free_port()
    (folder / "sshd_config").write_text(
        f"Port {port}\n"
        + "".join(f"ListenAddress {address}\n" for address in ADDRESSES)
        + f"HostKey {folder / 'host_key'}\n"
        f"PidFile {folder / 'sshd.pid'}\n"
        f"AuthorizedKeysFile {folder / 'authorized_keys'}\n"
        "PermitRootLogin prohibit-password\nPubkeyAuthentication yes\n"
        "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\n"
        "StrictModes no\nUseDNS no\nPrintMotd no\nLogLevel ERROR\n"
        "MaxStartups 100:30:200\nMaxSessions 100\n"
    )
    Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege separation folder
    # sshd and its sessions must not carry a test's marker: they are not the job's processes.
    env = {name: value for name, value in os.environ.items() if name != MARKER}
    sshd = subprocess.Popen(
        [SSHD, "-D", "-e", "-f", str(folder / "sshd_config")],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=open(folder / "sshd.log", "wb"),
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 20
        while not _answers(port):
            if sshd.poll() is not None or time.monotonic() > deadline:
                pytest.skip(f"sshd did not start: {(folder / 'sshd.log').read_text()[-500:]}")
            time.sleep(0.1)
        (folder / "hosts").write_text(
            "# the stand-in hosts\n\n" + "".join(f"{a}:{port}\n" for a in ADDRESSES)
        )
        ssh = (
            f"ssh -F /dev/null -i {folder / 'client_key'} -o IdentitiesOnly=yes "
            f"-o UserKnownHostsFile={folder / 'known_hosts'} "
            "-o StrictHostKeyChecking=accept-new -o LogLevel=ERROR"
        )
        yield StandIns(folder / "hosts", ssh, port, sshd.pid)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(sshd.pid, signal.SIGTERM)
        try:
            sshd.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(sshd.pid, signal.SIGKILL)
            sshd.wait()
