"""Exact resumption of a distributed job after a SIGKILL (issue 31, item 3; issue 39, item 1).

Each job runs tests/distributed/scripts/dist_worker.py on two workers and one
server (or two) under ``mxoid launch``: ``dist_sync`` with the optimizer on the workers
(``update_on_kvstore=False``, so rank 0's checkpoints hold its states) or, by
default, on the servers (rank 0 fetches the servers' states at each save, and
they are given back on resumption), every
rank shuffling its own shard with its own NumPy seed, dropout drawing each
rank's own MXNet random numbers, a Checkpoint every 4 batches. A worker, the
launcher or a server is SIGKILLed in the second epoch, once batch 12's
checkpoint is written (mid-epoch); the same command relaunched with
``--resume-from`` must end with the parameters of the uninterrupted job, bit
for bit, on both ranks.
"""

import fcntl
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

from jobs import marked_processes, results, run_job  # noqa: E402

pytestmark = pytest.mark.adversarial

WORKER = [sys.executable, SCRIPTS / "dist_worker.py"]
EXACT = ["--update-on-workers", "--shuffle", "--dropout", "0.2", "--checkpoint-every", "4"]
ON_SERVERS = EXACT[1:]  # the default: update_on_kvstore, the optimizer on the servers
SPLIT = "150"  # MXNET_KVSTORE_BIGARRAY_BOUND: fc1_weight (160 values) split, not the reductions
BATCH_12 = "checkpoint-*-epoch0001-batch00000012"  # a checkpoint's folder: mid-epoch 2 of 2
SECONDS = 60  # a generous bound for any one step of these tests on a loaded machine

_uninterrupted = {}  # (optimizer, options, servers) -> (rank 0's parameters, rank 1's)


def command(out, directory, optimizer, options=EXACT):
    return WORKER + ["--out", out, "--checkpoint", directory, "--optimizer", optimizer, *options]


def uninterrupted(tmp_path_factory, optimizer, options=EXACT, servers=1):
    """Both ranks' final parameters after the job ran without interruption (once per
    optimizer, place of the optimizer and number of servers, and per test session: the
    test processes of ``pytest -n`` share it through a folder of the session, under a lock).
    """
    key = (optimizer, tuple(options), servers)
    if key not in _uninterrupted:
        shared = tmp_path_factory.getbasetemp()  # this session's (pytest-N) ...
        if os.environ.get("PYTEST_XDIST_WORKER"):  # ... above this process's (pytest-N/popen-gw0)
            shared = shared.parent
        name = "uninterrupted-" + "-".join(map(str, (optimizer, servers, options == EXACT)))
        with open(shared / f"{name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            out = shared / name
            if not (out / "passed").exists():
                out = tmp_path_factory.mktemp(name)  # a fresh folder, whatever failed before
                checkpoints = out / "checkpoints"
                job = run_job(out, command(out, checkpoints, optimizer, options), servers=servers)
                assert job.status == 0, job
                (shared / name).unlink(missing_ok=True)
                (shared / name).symlink_to(out)
                (out / "passed").touch()
            (_, params0), (_, params1) = results(out)
        for name in params0:
            assert np.array_equal(params0[name], params1[name]), name
        _uninterrupted[key] = (params0, params1)
    return _uninterrupted[key]


def resume_and_compare(tmp_path_factory, tmp_path, optimizer, directory, servers=1, options=EXACT):
    """Relaunch the job from ``directory``'s newest checkpoint (mid-epoch 2); compare it with
    the uninterrupted job on both ranks."""
    saved = latest_checkpoint(str(directory))
    status = saved.loop_state["status"]
    assert status["iterations_done"] == 12 and status["epoch_started"], status
    if options == EXACT:
        assert saved.optimizer_states is not None  # the workers' optimizer: its states are saved
    else:  # the servers' optimizer: each server's states are saved
        assert saved.optimizer_states is None and len(saved.server_states["servers"]) == servers
    own = saved.loop_state["rank_states"]  # each rank's own random states and position
    assert len(own) == 2 and own[0]["data_position"] != own[1]["data_position"]
    assert own[0]["random"] != own[1]["random"]

    out = tmp_path / "resumed"
    out.mkdir()
    resumed = command(out, directory, optimizer, options) + ["--resume-from", directory]
    job = run_job(out, resumed, servers=servers)
    assert job.status == 0, job
    assert "restart from zero" not in job.stderr, job  # the servers' states too: no warning
    resumed = [report["status"]["iterations_done"] for report, _ in results(out)]
    assert resumed == [20, 20]
    for rank, reference in enumerate(uninterrupted(tmp_path_factory, optimizer, options)):
        params = results(out)[rank][1]
        assert params.keys() == reference.keys()
        for name in reference:
            assert np.array_equal(params[name], reference[name]), (rank, name)


def role(pid):
    """'server', 'worker' or None: the role of process ``pid`` of a launched job."""
    with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
        if b"\0--role\0server" in cmdline.read():  # launch --role server
            return "server"
    with open(f"/proc/{pid}/environ", "rb") as environ:
        return "worker" if b"DMLC_ROLE=worker" in environ.read().split(b"\0") else None


def kill_mid_epoch(out, directory, optimizer, victim, marker, servers=1, options=EXACT):
    """Run the job under ``python -m mxoid.distributed.launch`` and SIGKILL ``victim`` (the
    launcher, one worker or one server) once batch 12's checkpoint is written, in the second
    epoch (the workers wait there to be killed: ``--hold-after``); return the launcher's
    status and output once every process has ended."""
    launcher = subprocess.Popen(
        [sys.executable, "-m", "mxoid.distributed.launch", "-n", "2", "-s", str(servers)]
        + ["--timeout", "120", "--grace", "1", "--"]  # the held workers wait for no one
        + [str(part) for part in command(out, directory, optimizer, options)]
        + ["--hold-after", "12"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + SECONDS
        while not list(directory.glob(BATCH_12)) and time.monotonic() < deadline:
            assert launcher.poll() is None, launcher.communicate()[0]
            time.sleep(0.02)
        if victim == "launcher":
            launcher.kill()
        else:
            pids = [pid for pid in marked_processes(marker) if role(pid) == victim]
            os.kill(max(pids), signal.SIGKILL)  # a worker: either rank
        output, _ = launcher.communicate(timeout=SECONDS)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.communicate()
    deadline = time.monotonic() + SECONDS
    while marked_processes(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not marked_processes(marker), output  # no process outlives the job
    return launcher.returncode, output


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
@pytest.mark.parametrize("victim", ["worker", "launcher", "server"])
def test_sigkill_mid_epoch_then_resumption_is_exact_on_both_ranks(
    tmp_path_factory, tmp_path, job_env, victim, optimizer
):
    directory = tmp_path / "checkpoints"
    killed = tmp_path / "killed"
    killed.mkdir()
    status, output = kill_mid_epoch(killed, directory, optimizer, victim, job_env)
    expected = {"launcher": -signal.SIGKILL, "worker": 128 + signal.SIGKILL, "server": 1}
    assert status == expected[victim], output
    if victim != "launcher":
        assert f"mxoid launch: {victim} " in output and "SIGKILL" in output, output
    assert not list(killed.glob("rank*.json")), output  # nobody finished
    resume_and_compare(tmp_path_factory, tmp_path, optimizer, directory)


def test_sigkill_of_one_of_two_servers_then_resumption_is_exact(
    tmp_path_factory, tmp_path, job_env
):
    """Two servers, each holding half of the arrays: the same parameters as with one (the
    sum of two workers' gradients does not depend on the order), after the resumption."""
    directory = tmp_path / "checkpoints"
    killed = tmp_path / "killed"
    killed.mkdir()
    status, output = kill_mid_epoch(killed, directory, "adam", "server", job_env, servers=2)
    assert status == 1 and "mxoid launch: server " in output, output
    resume_and_compare(tmp_path_factory, tmp_path, "adam", directory, servers=2)


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
@pytest.mark.parametrize("victim", ["worker", "launcher", "server"])
def test_with_the_optimizer_on_the_servers_resumption_is_exact_on_both_ranks(
    tmp_path_factory, tmp_path, job_env, victim, optimizer
):
    """The default update_on_kvstore: the servers' momentum or Adam moments and update
    counts are saved by rank 0 at each save and given back to the servers on resumption."""
    directory = tmp_path / "checkpoints"
    killed = tmp_path / "killed"
    killed.mkdir()
    status, output = kill_mid_epoch(
        killed, directory, optimizer, victim, job_env, options=ON_SERVERS
    )
    assert status != 0 and not list(killed.glob("rank*.json")), output
    resume_and_compare(tmp_path_factory, tmp_path, optimizer, directory, options=ON_SERVERS)


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
@pytest.mark.parametrize("victim", ["worker", "launcher", "server"])
def test_with_the_optimizer_on_two_servers_splitting_an_array_resumption_is_exact(
    tmp_path_factory, tmp_path, job_env, monkeypatch, victim, optimizer
):
    """Two servers, fc1_weight split across them (MXNET_KVSTORE_BIGARRAY_BOUND): each server's
    states go back to the server of its rank; the parameters are those of one server's job."""
    monkeypatch.setenv("MXNET_KVSTORE_BIGARRAY_BOUND", SPLIT)
    directory = tmp_path / "checkpoints"
    killed = tmp_path / "killed"
    killed.mkdir()
    status, output = kill_mid_epoch(
        killed, directory, optimizer, victim, job_env, servers=2, options=ON_SERVERS
    )
    assert status != 0 and not list(killed.glob("rank*.json")), output
    resume_and_compare(
        tmp_path_factory, tmp_path, optimizer, directory, servers=2, options=ON_SERVERS
    )


@pytest.mark.parametrize("kvstore", ["dist_sync", "dist_async"])
def test_resuming_with_the_optimizer_on_the_servers_warns(tmp_path, job_env, kvstore):
    """update_on_kvstore=True (a dist kvstore's default) where the servers' optimizer states
    cannot be given back: with dist_sync on another number of servers than the checkpoint's
    (a server's states fit only its key range), with dist_async always. They restart; the
    warning says so and names the fix (dist_async: what is not exact)."""
    directory = tmp_path / "checkpoints"
    first = WORKER + ["--out", tmp_path, "--kvstore", kvstore, "--checkpoint", directory]
    job = run_job(tmp_path, first + ["--epochs", "1"])
    assert job.status == 0, job
    assert "resuming from" not in job.stderr
    servers = 2 if kvstore == "dist_sync" else 1
    job = run_job(tmp_path, first + ["--epochs", "2", "--resume-from", directory], servers=servers)
    assert job.status == 0, job
    if kvstore == "dist_sync":
        expected = ["restart from zero", "update_on_kvstore=False", "Resume with 1 server(s)"]
    else:
        expected = ["with dist_async", "not exactly as without the interruption"]
    for text in expected:
        assert text in job.stderr, job
    assert job.stderr.count("UserWarning: resuming from") == 1, job  # rank 0 only


def test_workers_that_would_resume_from_different_checkpoints_fail_together(tmp_path, job_env):
    """A worker that cannot see rank 0's checkpoint (here: rank 1 is given none) would start
    anew: every worker refuses, saying what each found and what is needed."""
    directory, first, second = tmp_path / "checkpoints", tmp_path / "first", tmp_path / "second"
    first.mkdir(), second.mkdir()
    options = ["--update-on-workers", "--checkpoint", directory]
    job = run_job(first, WORKER + ["--out", first, "--epochs", "1", *options])
    assert job.status == 0, job
    resumed = ["--epochs", "2", "--resume-from", directory, "--resume-only-on-rank", "0"]
    job = run_job(second, WORKER + ["--out", second, *options, *resumed], grace=3.0)
    assert job.status == 1, job
    for worker in ("[worker 0]", "[worker 1]"):
        assert any(
            line.startswith(worker) and "would resume from different checkpoints" in line
            for line in job.stderr.splitlines()
        ), job
    assert "rank 1: none (a new run)" in job.stderr, job
    assert "a file system every host shares" in job.stderr, job
    assert not list(second.glob("rank*.npz")), job
