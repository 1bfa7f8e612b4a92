"""Exact resumption of a distributed job after a SIGKILL (issue 31, item 3).

Each job runs tests/distributed/scripts/dist_worker.py on two workers and one
server under ``mxoid launch``: ``dist_sync`` with the optimizer on the workers
(``update_on_kvstore=False``, so rank 0's checkpoints hold its states), every
rank shuffling its own shard with its own NumPy seed, dropout drawing each
rank's own MXNet random numbers, a Checkpoint every 4 batches. A worker, the
launcher or a server is SIGKILLed in the second epoch (after batch 13, so the
newest checkpoint is batch 12's, mid-epoch); the same command relaunched with
``--resume-from`` must end with the parameters of the uninterrupted job, bit
for bit, on both ranks.
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from mxoid.checkpoint import latest_checkpoint

SCRIPTS = Path(__file__).parent / "scripts"
sys.path.insert(0, str(SCRIPTS))

from jobs import job_environment, marked_processes, results, run_job  # noqa: E402

pytestmark = pytest.mark.adversarial

WORKER = [sys.executable, SCRIPTS / "dist_worker.py"]
EXACT = ["--update-on-workers", "--shuffle", "--dropout", "0.2", "--checkpoint-every", "4"]
KILLED_AFTER = 13  # batches: the newest checkpoint is then batch 12's, in epoch 2 of 2
SECONDS = 60  # a generous bound for any one step of these tests on a loaded machine

_uninterrupted = {}  # optimizer -> (rank 0's parameters, rank 1's)


@pytest.fixture
def job_env(monkeypatch):
    with job_environment(monkeypatch) as marker:
        yield marker


def command(out, directory, optimizer):
    return WORKER + ["--out", out, "--checkpoint", directory, "--optimizer", optimizer, *EXACT]


def uninterrupted(tmp_path_factory, optimizer):
    """Both ranks' final parameters after the job ran without interruption (once per optimizer)."""
    if optimizer not in _uninterrupted:
        out = tmp_path_factory.mktemp(f"uninterrupted-{optimizer}")
        job = run_job(out, command(out, out / "checkpoints", optimizer))
        assert job.status == 0, job
        (_, params0), (_, params1) = results(out)
        for name in params0:
            assert np.array_equal(params0[name], params1[name]), name
        _uninterrupted[optimizer] = (params0, params1)
    return _uninterrupted[optimizer]


def resume_and_compare(tmp_path_factory, tmp_path, optimizer, directory):
    """Relaunch the job from ``directory``'s batch-12 checkpoint; compare it with the
    uninterrupted job on both ranks."""
    saved = latest_checkpoint(str(directory))
    assert saved.loop_state["status"]["iterations_done"] == 12
    assert saved.optimizer_states is not None  # the workers' optimizer: its states are saved
    own = saved.loop_state["rank_states"]  # each rank's own random states and position
    assert len(own) == 2 and own[0]["data_position"] != own[1]["data_position"]
    assert own[0]["random"] != own[1]["random"]

    out = tmp_path / "resumed"
    out.mkdir()
    job = run_job(out, command(out, directory, optimizer) + ["--resume-from", directory])
    assert job.status == 0, job
    resumed = [report["status"]["iterations_done"] for report, _ in results(out)]
    assert resumed == [20, 20]
    for rank, reference in enumerate(uninterrupted(tmp_path_factory, optimizer)):
        params = results(out)[rank][1]
        assert params.keys() == reference.keys()
        for name in reference:
            assert np.array_equal(params[name], reference[name]), (rank, name)


def launch_in_background(out, directory, optimizer):
    """Start ``python -m mxoid.distributed.launch`` on the job; return it once a worker has
    trained batch ``KILLED_AFTER``."""
    launcher = subprocess.Popen(
        [sys.executable, "-m", "mxoid.distributed.launch", "-n", "2", "--timeout", "120", "--"]
        + [str(part) for part in command(out, directory, optimizer)]
        + ["--delay", "0.1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + SECONDS
    seen = []
    while time.monotonic() < deadline:
        line = launcher.stdout.readline()
        seen.append(line)
        if f"BATCH {KILLED_AFTER}" in line or not line:
            break
    assert f"BATCH {KILLED_AFTER}" in seen[-1], "".join(seen)
    return launcher


def is_server(pid):
    """Whether process ``pid`` is a parameter server (``launch --role server``)."""
    with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
        return b"\0--role\0server" in cmdline.read()


def wait_for_no_process(marker):
    deadline = time.monotonic() + SECONDS
    while marked_processes(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not marked_processes(marker)


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_sigkill_of_one_worker_mid_epoch_then_resumption_is_exact(
    tmp_path_factory, tmp_path, job_env, optimizer
):
    directory = tmp_path / "checkpoints"
    killed = tmp_path / "killed"
    killed.mkdir()
    job = run_job(
        killed,
        command(killed, directory, optimizer) + ["--act", "kill", "--act-at", str(KILLED_AFTER)],
    )
    assert job.status == 128 + signal.SIGKILL, job
    assert "was killed by SIGKILL" in job.stderr.strip().splitlines()[-1], job
    resume_and_compare(tmp_path_factory, tmp_path, optimizer, directory)


@pytest.mark.parametrize("victim, optimizer", [("launcher", "sgd"), ("server", "adam")])
def test_sigkill_of_the_launcher_or_a_server_then_resumption_is_exact(
    tmp_path_factory, tmp_path, job_env, victim, optimizer
):
    directory = tmp_path / "checkpoints"
    killed = tmp_path / "killed"
    killed.mkdir()
    launcher = launch_in_background(killed, directory, optimizer)
    try:
        if victim == "launcher":
            launcher.kill()
        else:
            (server,) = [pid for pid in marked_processes(job_env) if is_server(pid)]
            os.kill(server, signal.SIGKILL)
        output, _ = launcher.communicate(timeout=SECONDS)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.communicate()
    assert launcher.returncode != 0, output
    wait_for_no_process(job_env)  # the launcher's processes die with it (or end the job)
    assert not list(killed.glob("rank*.json")), output  # nobody finished
    resume_and_compare(tmp_path_factory, tmp_path, optimizer, directory)


@pytest.mark.parametrize("kvstore", ["dist_sync", "dist_async"])
def test_resuming_with_the_optimizer_on_the_servers_warns(tmp_path, job_env, kvstore):
    """update_on_kvstore=True (a dist kvstore's default): the servers' optimizer states
    restart; the warning says so and names the fix (dist_async: what is not exact)."""
    directory = tmp_path / "checkpoints"
    first = WORKER + ["--out", tmp_path, "--kvstore", kvstore, "--checkpoint", directory]
    job = run_job(tmp_path, first + ["--epochs", "1"])
    assert job.status == 0, job
    assert "resuming from" not in job.stderr
    job = run_job(tmp_path, first + ["--epochs", "2", "--resume-from", directory])
    assert job.status == 0, job
    if kvstore == "dist_sync":
        expected = ["restart from zero", "update_on_kvstore=False"]
    else:
        expected = ["with dist_async", "not exactly as without the interruption"]
    for text in expected:
        assert text in job.stderr, job
    assert job.stderr.count("UserWarning: resuming from") == 1, job  # rank 0 only
