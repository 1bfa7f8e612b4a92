"""Running ``mxoid launch`` in the tests: bounded in time, and checked for leftover processes.

Every process a test starts inherits ``MXOID_TEST_MARKER`` (a fresh value per
test), so that a scan of ``/proc`` finds any of them still alive afterwards.
"""

import contextlib
import json
import os
import signal
import time
import uuid
from pathlib import Path

import numpy as np

from mxoid.distributed.launch import launch

ROOT = Path(__file__).resolve().parents[3]
MARKER = "MXOID_TEST_MARKER"


def marked_processes(marker):
    """Pids of the live processes (not zombies) whose environment holds ``MARKER=marker``."""
    wanted = f"{MARKER}={marker}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as environ:
                if wanted not in environ.read().split(b"\0"):
                    continue
            with open(f"/proc/{entry}/stat") as stat:
                if stat.read().rsplit(")", 1)[1].split()[0] == "Z":
                    continue
        except OSError:
            continue
        found.append(int(entry))
    return found


@contextlib.contextmanager
def job_environment(monkeypatch):
    """Set the marker and the one-thread settings for the processes started inside; on exit,
    kill (and report) any of them still alive."""
    marker = uuid.uuid4().hex
    monkeypatch.setenv(MARKER, marker)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("MXNET_CPU_WORKER_NTHREADS", "1")
    monkeypatch.setenv("MXNET_SUBGRAPH_VERBOSE", "0")
    monkeypatch.setenv(
        "PYTHONPATH",
        os.pathsep.join(
            [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        ),
    )
    try:
        yield marker
    finally:
        leftovers = marked_processes(marker)
        for pid in leftovers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        assert not leftovers, f"processes left behind: {leftovers}"


@contextlib.contextmanager
def alarm(seconds):
    """Raise TimeoutError in the main thread after ``seconds`` (a last resort bound)."""

    def expired(number, frame):
        raise TimeoutError(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


class Job:
    """The result of one launch: status, output, seconds taken, and when it ended."""

    def __init__(self, status, stdout, stderr, seconds, ended):
        self.status, self.stdout, self.stderr = status, stdout, stderr
        self.seconds, self.ended = seconds, ended

    def __repr__(self):
        return (
            f"<Job status={self.status} in {self.seconds:.1f} s>\n--- stdout\n{self.stdout}"
            f"\n--- stderr\n{self.stderr}"
        )


def run_job(tmp_path, command, workers=2, servers=1, timeout=90, grace=1.0, **options):
    """Run ``command`` with ``mxoid.distributed.launch.launch`` in this process.

    Output goes to files.
    """
    out_path, err_path = tmp_path / "launch.out", tmp_path / "launch.err"
    start = time.monotonic()
    with open(out_path, "wb") as out, open(err_path, "wb") as err, alarm(int(timeout + 60)):
        status = launch(
            [str(part) for part in command],
            workers,
            servers,
            timeout=timeout,
            grace=grace,
            stdout=out,
            stderr=err,
            **options,
        )
    ended = time.time()
    return Job(status, out_path.read_text(), err_path.read_text(), time.monotonic() - start, ended)


def results(out, workers=2):
    """Per rank: (the dist_worker.py report ``rank<r>.json``, its final parameters)."""
    return [
        (json.loads((out / f"rank{rank}.json").read_text()), dict(np.load(out / f"rank{rank}.npz")))
        for rank in range(workers)
    ]
