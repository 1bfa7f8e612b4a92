"""Signals acknowledged at once, whatever the engine is doing, and a second Ctrl-C never lost."""

import os
import select
import signal
import subprocess
import sys
import time

import pytest

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "slow_host_ahead.py")

pytestmark = pytest.mark.adversarial


def start():
    env = dict(os.environ, OMP_NUM_THREADS="1", MXNET_SUBGRAPH_VERBOSE="0", PYTHONUNBUFFERED="1")
    return subprocess.Popen(
        [sys.executable, SCRIPT], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )


def read_until(stream, marker, deadline):
    """Read ``stream`` until a line holding ``marker``; return (lines, seconds it took)."""
    started, lines = time.monotonic(), []
    while time.monotonic() < deadline:
        ready, _, _ = select.select([stream], [], [], 0.05)
        if ready:
            line = stream.readline().decode(errors="replace")
            if not line:
                break
            lines.append(line)
            if marker in line:
                return lines, time.monotonic() - started
    raise AssertionError(f"no {marker!r} in {lines[-5:]}")


def test_a_ctrl_c_is_acknowledged_within_a_second_and_a_second_one_is_never_lost():
    """The host queues an epoch of 150 batches in a moment and then waits seconds at its end
    for the devices (inside MXNet's WaitAll): a Ctrl-C sent then is said at once, not when
    the engine catches up, and a second one 50 ms later is not lost (Python keeps one
    pending flag per signal: before, the two became one), so training stops after the
    current batch, the epoch's last, with exit status 130."""
    for _attempt in range(3):
        process = start()
        try:
            read_until(process.stdout, "QUEUED 150", time.monotonic() + 120)
            time.sleep(0.3)  # the host is in its wait at the epoch's end
            process.send_signal(signal.SIGINT)
            sent = time.monotonic()
            _, took = read_until(process.stderr, "Ctrl-C received", sent + 30)
            assert took < 1.0, f"acknowledged after {took:.2f} s"
            time.sleep(max(0.0, 0.05 - (time.monotonic() - sent)))
            process.send_signal(signal.SIGINT)
            out, err = process.communicate(timeout=60)
        finally:
            if process.poll() is None:
                process.kill()
                process.communicate()
        # This test's process, starved of CPU on a loaded machine, can send the signals
        # after the epoch's end, once the host queued the next epoch: then the scenario did
        # not happen (the run ends as it should for signals at the last epoch's end). Again.
        if "QUEUED 160" not in out.decode():
            break
    else:
        raise AssertionError("three runs: the signals came after the epoch's end each time")
    err = err.decode()
    assert process.returncode == 128 + signal.SIGINT, err[-2000:]
    assert "SIGINT received: training stops after the current batch" in err  # the second
    stopped = [line for line in out.decode().splitlines() if line.startswith("STOPPED")]
    assert stopped == ["STOPPED 150 1"]
