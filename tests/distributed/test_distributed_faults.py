"""Distributed faults on one host: every one ends the job promptly, with the right worker's
error and exit status, or stops every worker cleanly after the same batch.

Each job runs tests/distributed/scripts/dist_worker.py on two workers under ``mxoid launch``.
"""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mxoid import read_log
from mxoid.checkpoint import latest_checkpoint

SCRIPTS = Path(__file__).parent / "scripts"
sys.path.insert(0, str(SCRIPTS))

from jobs import run_job  # noqa: E402

pytestmark = pytest.mark.adversarial

WORKER = [sys.executable, SCRIPTS / "dist_worker.py"]
BOUND = 30  # seconds from the fault to the end of the job


def reports(out):
    return [
        json.loads((out / f"rank{rank}.json").read_text())
        for rank in range(2)
        if (out / f"rank{rank}.json").exists()
    ]


def test_a_bad_argument_on_one_rank_ends_the_job_with_its_error(tmp_path, job_env):
    job = run_job(
        tmp_path, WORKER + ["--out", tmp_path, "--bad-argument-on-rank", "1"], timeout=120
    )
    assert job.seconds < BOUND, job
    assert job.status == 1, job
    last = job.stderr.strip().splitlines()[-1]
    assert last.startswith("mxoid launch: worker") and "exited with status 1" in last, job
    assert "TypeError: contexts must be an mx.Context" in last, job  # the worker's own error
    assert not reports(tmp_path)


def test_an_exception_right_after_kv_create_on_one_rank_ends_the_job(tmp_path, job_env):
    """Before MainLoop: the worker's excepthook exits instead of ps-lite's finalize barrier."""
    job = run_job(
        tmp_path, WORKER + ["--out", tmp_path, "--raise-after-create-on-rank", "1"], timeout=120
    )
    assert job.seconds < BOUND, job
    assert job.status == 1, job
    assert "Traceback (most recent call last)" in job.stderr, job
    assert "ValueError: cannot load the data on rank 1 (on purpose)" in job.stderr, job
    last = job.stderr.strip().splitlines()[-1]
    assert "exited with status 1: ValueError: cannot load the data on rank 1" in last, job
    assert not reports(tmp_path)


def test_sys_exit_with_a_failure_code_after_kv_create_ends_the_job(tmp_path, job_env):
    code = (
        "import sys, mxnet as mx, mxoid.distributed; kv = mx.kv.create('dist_sync'); "
        "print('rank', kv.rank, flush=True); kv.rank == 1 and sys.exit(3); kv._barrier()"
    )
    job = run_job(tmp_path, [sys.executable, "-c", code], timeout=120)
    assert job.seconds < BOUND, job
    assert job.status == 3, job
    assert "called sys.exit(3) in its script" in job.stderr, job


def test_sys_exit_in_an_extension_on_one_rank_ends_the_job(tmp_path, job_env):
    job = run_job(
        tmp_path,
        WORKER + ["--out", tmp_path, "--misbehave", "exit", "--act-at", "4", "--epochs", "50"],
        timeout=120,
    )
    assert job.seconds < BOUND, job
    assert job.status == 1, job
    assert "called sys.exit(0) during training" in job.stderr, job
    assert not reports(tmp_path)


def test_a_time_limit_on_one_rank_stops_every_rank_after_the_same_batch(tmp_path, job_env):
    job = run_job(
        tmp_path,
        WORKER
        + ["--out", tmp_path, "--epochs", "50", "--delay", "0.05", "--seconds-on-rank-0", "1.0"],
        timeout=120,
    )
    assert job.status == 0, job
    first, second = reports(tmp_path)
    done = first["status"]["iterations_done"]
    assert done == second["status"]["iterations_done"] and done < 50 * 10
    assert done % 10 == 0  # an agreement point: every 20 batches and every epoch end (10)
    assert "TimeLimit: time limit of 1 s reached" in first["status"]["stop_reason"]
    assert second["status"]["stop_reason"] == "rank 0 asked to stop"


def test_sigterm_to_one_worker_stops_every_worker_cleanly(tmp_path, job_env):
    directory, log = tmp_path / "checkpoints", tmp_path / "log.jsonl"
    job = run_job(
        tmp_path,
        WORKER
        + [
            "--out",
            tmp_path,
            "--epochs",
            "50",
            "--misbehave",
            "sigterm",
            "--act-at",
            "7",
            "--checkpoint",
            directory,
            "--log",
            log,
        ],
        timeout=120,
    )
    assert job.seconds < BOUND, job
    assert job.status == 128 + signal.SIGTERM, job
    # Batch 7 on rank 1; every worker stops at the next agreement, the end of epoch 1.
    assert job.stderr.count("Training interrupted by SIGTERM after 1 epoch and 10 batches") == 2, (
        job
    )
    assert "Rank 0 saves the checkpoints; resume with" in job.stderr
    saved = latest_checkpoint(str(directory))
    assert saved.loop_state["status"]["iterations_done"] == 10
    rows = read_log(log)
    assert rows[-1]["iteration"] == 10
    assert rows[-1]["training_finish_requested"].startswith("rank 1 was interrupted by SIGTERM")


@pytest.mark.parametrize("sent", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_the_launcher_stops_training_cleanly_on_every_worker(tmp_path, job_env, sent):
    directory, log = tmp_path / "checkpoints", tmp_path / "log.jsonl"
    command = [
        sys.executable,
        "-m",
        "mxoid.distributed.launch",
        "-n",
        "2",
        "--timeout",
        "120",
        "--",
        *map(str, WORKER),
        "--out",
        str(tmp_path),
        "--epochs",
        "50",
        "--delay",
        "0.05",
        "--checkpoint",
        str(directory),
        "--log",
        str(log),
    ]
    launcher = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            line = launcher.stdout.readline()
            if line.startswith("[worker 0] BATCH 13") or not line:
                break
        assert line, launcher.stderr.read()
        launcher.send_signal(sent)
        started = time.monotonic()
        out, err = launcher.communicate(timeout=BOUND + 30)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    name = signal.Signals(sent).name
    assert time.monotonic() - started < BOUND, err
    assert launcher.returncode == 128 + sent, err
    assert err.count(f"Training interrupted by {name}") == 2, err
    assert "passing it on to the workers" in err
    saved = latest_checkpoint(str(directory))
    status = saved.loop_state["status"]
    assert status["interrupted"] == name
    if sent == signal.SIGINT:  # a first Ctrl-C lets the epoch finish
        assert status["iterations_done"] % 10 == 0 and not status["epoch_started"]
    rows = read_log(log)
    assert rows[-1]["iteration"] == status["iterations_done"]
    assert rows[-1]["training_finish_requested"].startswith((f"interrupted by {name}", "rank "))
    assert not [p for p in (directory.iterdir()) if p.name.startswith(".tmp")]


def test_the_launcher_has_a_stall_timeout_by_default():
    import inspect

    from mxoid.distributed.launch import _parser, launch

    assert _parser().parse_args(["-n", "2"]).stall_timeout == 300
    assert inspect.signature(launch).parameters["stall_timeout"].default == 300
