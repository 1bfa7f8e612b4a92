"""What ``mxoid launch`` says: exit statuses (``--help`` and the docs), SSH advice, endings.

No process is started here: the messages are built from fakes.
"""

import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from mxoid.distributed.hosts import Host, HostError, _judge
from mxoid.distributed.launch import _parser
from mxoid.distributed.launched import LaunchedProcess

DOCS = Path(__file__).resolve().parents[2] / "docs" / "several-machines.md"
STATUSES = {
    "0": "every worker succeeded",
    "N": "a worker failed with status N (its own)",
    "124": "`--timeout` or `--stall-timeout`",
    "1": "the scheduler, a server or an SSH connection failed",
    "2": "wrong arguments; with `--slurm`, a task's check failed",
}


def help_text():
    return _parser().format_help()


def test_help_and_the_docs_give_every_exit_status_and_what_ends_a_job():
    text, docs = help_text(), DOCS.read_text()
    assert "What ends a job:" in text and "What ends the job" in docs
    for status, when in STATUSES.items():
        assert re.search(rf"^\| {status} \| {re.escape(when)}", docs, re.M), status
        assert re.search(rf"^  {status} +{re.escape(when.replace('`', ''))}", text, re.M), status
    assert "128+N    a worker was killed by signal N" in text
    assert "| 128 + N | a worker was killed by signal N" in docs
    assert "ssh's 255" in text and "255 is reported as 1" in docs


def test_mxoid_launch_help_runs_and_says_the_statuses():
    shown = subprocess.run(
        [sys.executable, "-m", "mxoid.distributed.launch", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.returncode == 0 and "Exit status:" in shown.stdout
    assert "--check-timeout" in shown.stdout


def test_the_host_key_fix_keeps_the_host_files_port():
    host = Host("127.0.0.2", 22222, "127.0.0.2")
    with pytest.raises(HostError) as raised:
        _judge(host, 255, "", b"Host key verification failed.", {})
    assert "(ssh -p 22222 127.0.0.2 true)" in str(raised.value)
    assert "ssh-copy-id -p 22222 127.0.0.2" in str(raised.value)


def test_a_refused_connection_gets_advice_about_the_port_and_sshd_not_keys():
    host = Host("127.0.0.3", 1, "127.0.0.3")
    said = b"ssh: connect to host 127.0.0.3 port 1: Connection refused"
    with pytest.raises(HostError) as raised:
        _judge(host, 255, "", said, {})
    message = str(raised.value)
    assert "nothing accepts SSH connections on port 1" in message
    assert "start sshd there, or write the port its sshd listens on" in message
    assert "'ssh -p 1 127.0.0.3 true'" in message
    assert "set up key authentication" not in message and "host key" not in message


class Ended:
    def __init__(self, code):
        self.returncode, self.pid = code, 4242


@pytest.mark.parametrize(
    "code, remote_code, status, words",
    [
        (255, None, 1, "the SSH connection of worker 1 on h (ssh pid 4242) was lost"),
        (143, 143, 143, "worker 1 on h (ssh pid 4242) exited with status 143 on h"),
        (143, -15, 143, "worker 1 on h (ssh pid 4242) was killed by SIGTERM on h"),
        (143, None, 143, "was killed by SIGTERM on h"),  # an agent of before 0.5
    ],
)
def test_a_remote_ending_is_told_as_the_agent_saw_it(code, remote_code, status, words):
    process = LaunchedProcess("worker", 1, Ended(code), Host("h", None, "10.0.0.1"))
    process.remote_code = remote_code
    assert process.job_status() == status
    assert words in process.describe_exit()
    if remote_code == 143:
        assert "killed" not in process.describe_exit()
    assert signal.SIGTERM == 15
