"""A job of two workers resumed with one and with three (issue 39, item 4).

The first job (tests/distributed/scripts/dist_worker.py: ``dist_sync``, every
rank shuffling its shard, dropout, momentum SGD, a Checkpoint every 4 batches)
stops on both workers after batch 14, 4 batches into its second epoch of 10,
and saves. The same script relaunched with ``--resume-from`` on another number
of workers must start from the checkpoint's parameters and optimizer states,
warn on every worker that the continuation is not the original job's and why,
skip the rest of the interrupted epoch (the new shards hold other rows) and
train its third epoch to the end, every worker ending with the same parameters.
"""

import pickle
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from mxoid.checkpoint import latest_checkpoint

SCRIPTS = Path(__file__).parent / "scripts"
sys.path.insert(0, str(SCRIPTS))

from jobs import results, run_job  # noqa: E402

pytestmark = pytest.mark.adversarial

WORKER = [sys.executable, SCRIPTS / "dist_worker.py"]
OPTIONS = ["--shuffle", "--dropout", "0.2", "--checkpoint-every", "4", "--epochs", "3"]
PLACES = {"servers": [], "workers": ["--update-on-workers"]}  # where the optimizer runs
ROWS, BATCH = 200, 10  # dist_worker.py's training rows, and its batch on each worker
NOT_IDENTICAL = "the continuation is not bit-identical to the original job"

_first = {}  # place -> the first job's checkpoint directory (2 workers, stopped at batch 14)


def first_job(tmp_path_factory, place):
    """The checkpoints of the 2-worker job, stopped mid-epoch 2 (once per place)."""
    if place not in _first:
        out = tmp_path_factory.mktemp(f"first-{place}")
        directory = out / "checkpoints"
        command = WORKER + ["--out", out, "--checkpoint", directory, "--batches", "14"]
        job = run_job(out, command + OPTIONS + PLACES[place])
        assert job.status == 0, job
        _first[place] = directory
    return _first[place]


def batches_per_epoch(workers):
    return -(-(ROWS // workers) // BATCH)  # mxoid.shard's rows, the last batch padded


@pytest.mark.parametrize("place", ["servers", "workers"])
@pytest.mark.parametrize("workers", [1, 3])
def test_a_job_of_two_workers_resumes_with_another_number_of_workers(
    tmp_path_factory, tmp_path, job_env, workers, place
):
    directory = tmp_path / "checkpoints"
    shutil.copytree(first_job(tmp_path_factory, place), directory)
    saved = latest_checkpoint(str(directory))
    status = saved.loop_state["status"]
    assert status["iterations_done"] == 14 and status["iterations_done_in_epoch"] == 4, status
    assert len(saved.loop_state["rank_states"]) == 2
    if place == "workers":
        assert saved.optimizer_states is not None
    else:
        assert saved.optimizer_states is None and len(saved.server_states["servers"]) == 1

    out = tmp_path / "resumed"
    out.mkdir()
    command = WORKER + ["--out", out, "--checkpoint", directory, "--resume-from", directory]
    job = run_job(out, command + ["--save-start"] + OPTIONS + PLACES[place], workers=workers)
    assert job.status == 0, job

    # Every worker warns: not bit-identical, and why; the interrupted epoch's rest is skipped.
    assert job.stderr.count(NOT_IDENTICAL) == workers, job
    for text in (
        f"saved by a job of 2 worker(s), with {workers} worker(s)",
        "the data is re-sharded",
        "random states are seeded anew",
        f"rescale_grad = {1 / (BATCH * workers):.6g}",
        "the rest of epoch 2 is skipped, and training resumes with epoch 3",
    ):
        assert text in job.stderr, job
    kept = "the optimizer states (every worker" if place == "workers" else "the servers' optim"
    assert kept in job.stderr and "restart from zero" not in job.stderr, job

    ends = results(out, workers)
    for rank in range(workers):
        # Right after the resumption: the checkpoint's parameters, on every worker.
        start = dict(np.load(out / f"start_rank{rank}.npz"))
        assert start.keys() == saved.arg_params.keys()
        for name, value in saved.arg_params.items():
            assert np.array_equal(start[name], value.asnumpy()), (rank, name)
        if place == "workers":  # and the optimizer's states, its rescaling of this job's count
            states, optimizer = pickle.loads((out / f"start_rank{rank}.states").read_bytes())
            saved_states, saved_optimizer = pickle.loads(saved.optimizer_states)
            assert states.keys() == saved_states.keys()
            for key, value in saved_states.items():
                assert np.array_equal(states[key].asnumpy(), value.asnumpy()), (rank, key)
            assert saved_optimizer.rescale_grad == 1 / (BATCH * 2)
            assert optimizer.rescale_grad == 1 / (BATCH * workers)
            assert optimizer.num_update == saved_optimizer.num_update
        # Trained to the end: epoch 3 whole, on the new shards.
        report, params = ends[rank]
        assert report["status"]["epochs_done"] == 3, report["status"]
        assert report["status"]["iterations_done"] == 14 + batches_per_epoch(workers)
        for name in params:
            assert np.array_equal(params[name], ends[0][1][name]), (rank, name)
            assert not np.array_equal(params[name], saved.arg_params[name].asnumpy()), name


def test_resumed_at_an_epoch_end_with_other_numbers_of_workers_and_servers(tmp_path, job_env):
    """A checkpoint of an epoch's end resumes at the next epoch's start, on the new shards;
    with another number of servers the servers' optimizer states restart, and both warnings
    say so."""
    directory = tmp_path / "checkpoints"
    command = WORKER + ["--out", tmp_path, "--checkpoint", directory]
    job = run_job(tmp_path, command + ["--epochs", "1"])
    assert job.status == 0, job
    saved = latest_checkpoint(str(directory))
    assert not saved.loop_state["status"]["epoch_started"]
    resumed = command + ["--epochs", "2", "--resume-from", directory, "--save-start"]
    job = run_job(tmp_path, resumed, workers=3, servers=2)
    assert job.status == 0, job
    assert job.stderr.count(NOT_IDENTICAL) == 3, job
    for text in (
        "Training resumes with epoch 2, on the new shards",
        "not the servers' optimizer states (they restart",
        "restart from zero",  # rank 0's warning about the servers' states, naming the fix
        "Resume with 1 server(s)",
    ):
        assert text in job.stderr, job
    for rank, (report, _) in enumerate(results(tmp_path, 3)):
        start = dict(np.load(tmp_path / f"start_rank{rank}.npz"))
        for name, value in saved.arg_params.items():
            assert np.array_equal(start[name], value.asnumpy()), (rank, name)
        assert report["status"]["iterations_done"] == 10 + batches_per_epoch(3)
