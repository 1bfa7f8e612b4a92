"""A DataLoader's short last batch under dist_sync: its step averaged over its real rows.

Two workers on MXNet's loopback dist_sync kvstore, each reading its shard through a
DataLoader whose last batch is short (``last_batch='keep'``), against one process
training every row with batches of both workers' rows. Where the servers run the
optimizer (``update_on_kvstore``) their ``rescale_grad`` is fixed when training starts:
the workers scale the short batch's gradients before the push. Where the workers update,
their own optimizer's ``rescale_grad`` changes for that step.
"""

import json
import sys
from pathlib import Path

import numpy as np
import pytest

SCRIPTS = Path(__file__).parent / "scripts"
sys.path.insert(0, str(SCRIPTS))

from gluon_short_worker import BATCH, EPOCHS, WHOLE_BATCHES, data, train  # noqa: E402
from jobs import run_job  # noqa: E402


@pytest.fixture(scope="module")
def one_process():
    """Every row in one process, batches of both workers' rows: the expected parameters."""
    _, net = train(*data(), 2 * BATCH)
    return {name: p.data().asnumpy() for name, p in net.collect_params().items()}


@pytest.mark.parametrize("where", ["servers", "workers"])
def test_the_short_batch_step_under_dist_sync_is_one_process_step(
    tmp_path, job_env, one_process, where
):
    command = [sys.executable, SCRIPTS / "gluon_short_worker.py", "--out", tmp_path]
    if where == "workers":
        command.append("--update-on-workers")
    job = run_job(tmp_path, command)
    assert job.status == 0, job
    for rank in range(2):
        report = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert report["update_on_kvstore"] is (where == "servers")
        assert report["scales_on_workers"] is (where == "servers")
        assert report["steps"] == EPOCHS * (WHOLE_BATCHES + 1)
        assert report["rescale_grad"] == pytest.approx(1 / (2 * BATCH))  # given back
        params = dict(np.load(tmp_path / f"rank{rank}.npz"))
        assert set(params) == set(one_process)
        for name, expected in one_process.items():
            np.testing.assert_allclose(params[name], expected, rtol=1e-5, atol=1e-6, err_msg=name)
