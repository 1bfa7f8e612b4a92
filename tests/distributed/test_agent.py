"""The agent that runs a process on another host: it ends the process group when its input
closes or falls silent, passes signals on, and exits with the process's status."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "scripts"))

from jobs import ROOT, marked_processes  # noqa: E402

pytestmark = pytest.mark.adversarial

# The command starts a grandchild in its own group, as a training script's helpers might.
SLEEPER = (
    "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', "
    "'import time; time.sleep(60)']); print('started', flush=True); time.sleep(60)"
)


def agent(*options, code=SLEEPER):
    command = [sys.executable, "-m", "mxoid.distributed.agent", "--grace", "0.5", *options]
    started = subprocess.Popen(
        [*command, "--", sys.executable, "-c", code],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
    )
    assert started.stdout.readline() == b"started\n"
    return started


def ended_cleanly(started, marker, within):
    deadline = time.monotonic() + within
    while (started.poll() is None or marked_processes(marker)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return started.poll() is not None and not marked_processes(marker)


def test_the_end_of_its_input_ends_the_whole_process_group(job_env):
    started = agent()
    start = time.monotonic()
    started.stdin.close()
    assert ended_cleanly(started, job_env, 10)
    assert time.monotonic() - start < 3
    assert b"the connection to the launcher closed" in started.stderr.read()


def test_no_heartbeat_for_the_timeout_ends_the_process_group(job_env):
    started = agent("--heartbeat-timeout", "1")
    assert ended_cleanly(started, job_env, 10)
    assert b"no word from the launcher for" in started.stderr.read()
    started.stdin.close()


def test_a_signal_line_reaches_the_process_and_its_status_comes_back(job_env):
    started = agent()
    started.stdin.write(f"\nsignal {int(signal.SIGTERM)}\n".encode())
    started.stdin.flush()
    assert ended_cleanly(started, job_env, 10)
    assert started.returncode == 128 + signal.SIGTERM
    assert b"was killed by SIGTERM" in started.stderr.read()
    started.stdin.close()


def test_a_killed_agent_takes_its_process_with_it(job_env):
    """By its parent-death signal (what the command started itself is the agent's to end)."""
    started = agent(code="import time; print('started', flush=True); time.sleep(60)")
    os.kill(started.pid, signal.SIGKILL)
    started.wait()
    assert ended_cleanly(started, job_env, 10)
    started.stdin.close()
