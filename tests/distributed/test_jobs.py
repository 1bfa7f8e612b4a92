"""Distributed training on MXNet's parameter server, through ``mxoid launch`` on 127.0.0.1.

Each job runs tests/distributed/scripts/dist_worker.py on two workers: an MLP
trained with ``MainLoop`` on ``dist_sync`` or ``dist_async``, with Evaluate
on each worker's shard of a validation set. The helpers of
:mod:`mxoid.distributed` and :mod:`mxoid.distributed.sharding` that need no kvstore are
tested in this process.
"""

import json
import sys
from pathlib import Path

import mxnet as mx
import numpy as np
import pytest

from mxoid import Evaluate, FinishAfter, MainLoop, distributed
from mxoid.data.position import batches_per_epoch
from mxoid.distributed import ServerOptimizer, allgather, allreduce_sums
from mxoid.distributed.sharding import shard, shard_arrays
from mxoid.distributed.workers import join_exactly, split_exactly

SCRIPTS = Path(__file__).parent / "scripts"
sys.path.insert(0, str(SCRIPTS))

import dist_worker  # noqa: E402
from jobs import results, run_job  # noqa: E402

WORKER = [sys.executable, SCRIPTS / "dist_worker.py"]
SECONDS_TO_STOP = 20  # from the failure to the launcher's return, on a loaded 2-core machine


@pytest.fixture(scope="module")
def one_process():
    """The same model trained in one process with the doubled batch, and its records."""
    X, y = dist_worker.data(200, seed=0)
    Xv, yv = dist_worker.data(60, seed=5)
    train = mx.io.NDArrayIter(X, y, batch_size=20, label_name="softmax_label")
    valid = mx.io.NDArrayIter(Xv, yv, batch_size=20, label_name="softmax_label")
    loop = MainLoop(
        dist_worker.network(),
        train,
        optimizer="sgd",
        optimizer_params=dict(dist_worker.OPTIMIZER_PARAMS),
        arg_params=dist_worker.initial_params(),
        kvstore=None,
        extensions=[
            FinishAfter(after_n_epochs=2),
            Evaluate({"valid": valid}, metrics=["acc", "ce"]),
        ],
    )
    loop.run()
    params = {name: value.asnumpy() for name, value in loop.get_params()[0].items()}
    records = {str(iteration): dict(row) for iteration, row in loop.log.items()}
    return params, records


def evaluation_records(report):
    return {
        iteration: {k: v for k, v in row.items() if k.startswith("valid_")}
        for iteration, row in report["records"].items()
        if "valid_accuracy" in row
    }


# ------------------------------------------------------------------ training jobs
@pytest.mark.parametrize("servers", [1, 2])
def test_dist_sync_matches_one_process_with_the_doubled_batch(
    tmp_path, job_env, one_process, servers
):
    job = run_job(tmp_path, WORKER + ["--out", tmp_path], servers=servers)
    assert job.status == 0, job
    (report0, params0), (report1, params1) = results(tmp_path)
    reference, reference_records = one_process
    for name in reference:
        assert np.array_equal(params0[name], params1[name]), name  # bit-identical workers
        np.testing.assert_allclose(
            params0[name], reference[name], rtol=1e-5, atol=1e-6, err_msg=name
        )
    assert report0["holds_servers"] and report1["holds_servers"]
    assert [report0["status"]["rank"], report1["status"]["rank"]] == [0, 1]
    assert report0["status"]["num_workers"] == report1["status"]["num_workers"] == 2

    # Evaluation: the same records on every worker, equal to one process on the whole set.
    records0, records1 = evaluation_records(report0), evaluation_records(report1)
    assert records0 == records1 and sorted(records0) == ["10", "20"]
    for iteration, row in records0.items():
        for name, value in row.items():
            assert value == pytest.approx(reference_records[iteration][name], rel=1e-5), name
    assert 0.5 < records0["20"]["valid_accuracy"] < 1.0

    # rank_zero_only extensions run on rank 0 only; the others on every worker.
    assert sorted(p.name for p in tmp_path.glob("rank_zero_rank*")) == ["rank_zero_rank0"]
    assert sorted(p.name for p in tmp_path.glob("everyone_rank*")) == [
        "everyone_rank0",
        "everyone_rank1",
    ]


def test_a_hand_written_loop_from_the_pieces_equals_main_loop_under_dist_sync(tmp_path, job_env):
    """tests/distributed/scripts/own_loop_worker.py: the manager, create_kvstore,
    create_optimizer, initialize_kvstore and update_params_on_kvstore on dist_sync, with
    MXNet's own set_optimizer, against dist_worker.py's MainLoop in the same job layout."""
    mine, theirs = tmp_path / "pieces", tmp_path / "main_loop"
    mine.mkdir(), theirs.mkdir()
    job = run_job(mine, [sys.executable, SCRIPTS / "own_loop_worker.py", "--out", mine])
    assert job.status == 0, job
    job = run_job(theirs, WORKER + ["--out", theirs])
    assert job.status == 0, job
    for rank in range(2):
        ours, loops = (dict(np.load(d / f"rank{rank}.npz")) for d in (mine, theirs))
        assert ours.keys() == loops.keys()
        for name in ours:
            np.testing.assert_allclose(ours[name], loops[name], rtol=1e-6, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("on_workers", [False, True])
def test_dist_sync_with_accumulated_batches_matches_one_process(
    tmp_path, job_env, one_process, on_workers
):
    """Two workers, batches of 5 accumulated in pairs: steps of 2 x 5 x 2 = 20 samples,
    as one process with batches of 20 (the optimizer on the servers, or on the workers)."""
    command = WORKER + ["--out", tmp_path, "--batch-size", "5", "--accumulate", "2"]
    job = run_job(tmp_path, command + (["--update-on-workers"] if on_workers else []))
    assert job.status == 0, job
    (report0, params0), (report1, params1) = results(tmp_path)
    reference, _ = one_process
    for name in reference:
        assert np.array_equal(params0[name], params1[name]), name
        np.testing.assert_allclose(
            params0[name], reference[name], rtol=1e-5, atol=1e-6, err_msg=name
        )
    assert report0["status"]["iterations_done"] == 40
    assert report0["status"]["updates_done"] == 20


def test_dist_async_runs_and_every_worker_ends_with_the_servers_parameters(tmp_path, job_env):
    job = run_job(
        tmp_path, WORKER + ["--out", tmp_path, "--kvstore", "dist_async", "--epochs", "3"]
    )
    assert job.status == 0, job
    (report0, params0), (report1, params1) = results(tmp_path)
    assert report0["holds_servers"] and report1["holds_servers"]  # pulled again after run()
    initial = dist_worker.initial_params()
    for name in params0:
        assert np.array_equal(params0[name], params1[name]), name
        assert not np.allclose(params0[name], initial[name].asnumpy(), atol=1e-3), name
    assert evaluation_records(report0) == evaluation_records(report1)
    assert report0["records"]["30"]["valid_accuracy"] > 0.5


@pytest.mark.parametrize("action, status", [("kill", 137), ("raise", 1)])
def test_a_failing_worker_stops_the_job_quickly(tmp_path, job_env, action, status):
    job = run_job(tmp_path, WORKER + ["--out", tmp_path, "--act", action, "--epochs", "50"])
    assert job.status == status, job
    acted = float((tmp_path / "acted").read_text())
    assert job.ended - acted < SECONDS_TO_STOP, job
    last_line = job.stderr.strip().splitlines()[-1]
    assert last_line.startswith("mxoid launch: worker "), job
    if action == "kill":
        assert "was killed by SIGKILL" in last_line
    else:
        assert "exited with status 1" in last_line
        assert "RuntimeError: extension failure on purpose" in job.stderr
        assert "mxoid: worker of rank 1 failed" in job.stderr
    assert not list(tmp_path.glob("rank*.json"))  # nobody finished training


def test_unequal_steps_are_a_clear_error_on_every_worker(tmp_path, job_env):
    # Both workers fail together; the grace period lets the second one report too.
    job = run_job(tmp_path, WORKER + ["--out", tmp_path, "--unequal"], grace=3.0)
    assert job.status == 1, job
    message = (
        "ValueError: workers would take unequal numbers of steps per epoch (rank 0: 10, rank 1: 7)"
    )
    for worker in ("[worker 0]", "[worker 1]"):
        assert any(
            line.startswith(worker) and message in line for line in job.stderr.splitlines()
        ), job


# ---------------------------------------------------------------- in-process helpers
def test_shard_arrays_gives_equal_strided_shares():
    X = np.arange(22).reshape(11, 2)
    shares = [shard_arrays(X, rank=rank, num_workers=3) for rank in range(3)]
    assert [len(share) for share in shares] == [3, 3, 3]
    np.testing.assert_array_equal(shares[1][:, 0], [2, 8, 14])
    both = shard_arrays({"data": X, "other": mx.nd.array(X)}, rank=0, num_workers=2)
    np.testing.assert_array_equal(both["data"], both["other"])
    _, label = shard_arrays((X, np.arange(11)), rank=1, num_workers=2)
    np.testing.assert_array_equal(label, [1, 3, 5, 7, 9])
    with pytest.raises(ValueError, match="kvstore, or both"):
        shard_arrays(X)
    with pytest.raises(ValueError, match="cannot be shared"):
        shard_arrays(X[:1], rank=0, num_workers=2)


def test_strided_shards_together_make_the_batches_of_one_process():
    X = np.arange(40, dtype="float32").reshape(20, 2)
    batch = next(iter(mx.io.NDArrayIter(X, batch_size=8))).data[0].asnumpy()
    parts = [
        next(iter(mx.io.NDArrayIter(shard_arrays(X, rank=r, num_workers=2), batch_size=4)))
        .data[0]
        .asnumpy()
        for r in range(2)
    ]
    np.testing.assert_array_equal(np.sort(np.concatenate(parts), axis=0), batch)


def test_reductions_without_a_distributed_kvstore_return_this_workers_values():
    totals = np.array([[3.0, 4.0], [1.5, 2.0]])
    np.testing.assert_array_equal(allreduce_sums(None, "metrics", totals), totals)
    assert allgather(mx.kv.create("local"), "x", totals).shape == (1, 2, 2)
    assert allreduce_sums(None, "count", 5).shape == ()


def test_distributed_sums_are_exact_in_float64_across_two_workers(tmp_path, job_env):
    """Issue 39.3: the servers' arithmetic is float32 (2^24 + 1 came back as 2^24)."""
    import sums_worker

    job = run_job(tmp_path, [sys.executable, SCRIPTS / "sums_worker.py", tmp_path], timeout=120)
    assert job.status == 0, job
    rows = np.stack([sums_worker.values(rank) for rank in range(2)])
    expected_sums = rows[0] + rows[1]  # float64, in rank order
    assert np.float32(rows[0, 0]) != rows[0, 0]  # float32 would lose these...
    assert np.float32(rows[0, 2]) + np.float32(rows[1, 2]) != expected_sums[2]  # ...and these
    for rank in range(2):
        report = json.loads((tmp_path / f"sums{rank}.json").read_text())
        gathered = np.array(report["gathered"], dtype=np.uint64).view(np.float64)
        assert gathered.view(np.uint64).tolist() == rows.view(np.uint64).tolist(), rank
        sums = np.array(report["sums"], dtype=np.uint64).view(np.float64)
        assert sums.view(np.uint64).tolist() == expected_sums.view(np.uint64).tolist(), rank
        assert report["count"] == 2 * (2**24 + 1)


def test_split_exactly_carries_every_float64_bit_in_float32_exact_parts():
    values = np.array([2.0**24 + 1, 2.0**53 - 1, -0.0, np.inf, np.nan, 1e300, 5e-324, 0.1])
    parts = split_exactly(values)
    assert parts.shape == (3 * len(values),) and (parts.astype(np.float32) == parts).all()
    joined = join_exactly(np.stack([parts, parts]))
    assert joined.view(np.uint64).tolist() == [values.view(np.uint64).tolist()] * 2


def test_server_optimizer_updates_parameters_and_merges_reduction_rows():
    sgd = mx.optimizer.SGD(learning_rate=0.5, rescale_grad=1.0)
    server = ServerOptimizer(sgd, num_param_keys=1, num_workers=2)
    weight, grad = mx.nd.ones((3,)), mx.nd.ones((3,))
    server.update_multi_precision(0, weight, grad, server.create_state_multi_precision(0, weight))
    np.testing.assert_allclose(weight.asnumpy(), 0.5)

    stored = mx.nd.zeros((6,))  # 2 workers x (2 values + flag), flattened as on a server
    assert server.create_state_multi_precision(1, stored) is None
    server.update_multi_precision(1, stored, mx.nd.array([0, 0, 0, 7, 8, 1]), None)
    np.testing.assert_array_equal(stored.asnumpy(), [0, 0, 0, 7, 8, distributed.MERGED])
    server.update_multi_precision(1, stored, mx.nd.array([5, 6, 1, 0, 0, 0]), None)
    np.testing.assert_array_equal(
        stored.asnumpy(), [5, 6, distributed.MERGED, 7, 8, distributed.MERGED]
    )

    replacing = ServerOptimizer(None, num_param_keys=1, num_workers=2)
    replacing.update_multi_precision(0, weight, mx.nd.array([1, 2, 3]), None)
    np.testing.assert_array_equal(weight.asnumpy(), [1, 2, 3])


def test_dist_async_refuses_updates_on_the_workers():
    class AsyncStore:
        type, rank = "dist_async", 0

    with pytest.raises(ValueError, match="update_on_kvstore=True"):
        distributed.set_server_optimizer(AsyncStore(), None, 4)


def test_shard_builds_an_ndarray_iterator_with_equal_steps():
    class Store:
        def __init__(self, rank):
            self.rank, self.num_workers = rank, 3

    X, y = np.zeros((31, 4)), np.arange(31)
    iterators = [shard(X, y, kvstore=Store(rank), batch_size=4) for rank in range(3)]
    assert {batches_per_epoch(it) for it in iterators} == {3}
    assert {sum(1 for _ in it) for it in iterators} == {3}
