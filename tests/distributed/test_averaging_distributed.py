"""EMA and SWA under dist_sync: two workers and a server on loopback (one launch)."""

import sys
from pathlib import Path

import mxnet as mx
import numpy as np

SCRIPTS = Path(__file__).parent / "scripts"
sys.path.insert(0, str(SCRIPTS))

from dist_worker import data  # noqa: E402
from jobs import run_job  # noqa: E402

from mxoid.checkpoint import latest_checkpoint  # noqa: E402


def test_averages_under_dist_sync_equal_numpys_on_every_worker(tmp_path, job_env):
    """Every worker's EMA is NumPy's average of the steps it saw (the servers' parameters,
    the same on both); SWA the mean of the epochs', its BatchNorm statistics each worker's
    own pass over its shard (by hand); rank 0's checkpoint holds its EMA."""
    job = run_job(tmp_path, [sys.executable, SCRIPTS / "averaging_worker.py", "--out", tmp_path])
    assert job.status == 0, job
    ranks = [dict(np.load(tmp_path / f"rank{r}.npz")) for r in range(2)]
    names = ["fc1_weight", "fc1_bias", "bn1_gamma", "bn1_beta", "fc2_weight", "fc2_bias"]
    X, y = data(120, seed=0)
    for rank, found in enumerate(ranks):
        steps = sorted({int(k[4:].split("_")[0]) for k in found if k.startswith("step")})
        assert steps == list(range(19))  # 60 rows a shard, batches of 10, 3 epochs
        for name in names:
            expected = found[f"step0_{name}"]
            for step in steps[1:]:
                expected = 0.9 * expected + 0.1 * found[f"step{step}_{name}"]
            np.testing.assert_allclose(found[f"ema_{name}"], expected, rtol=1e-5, atol=1e-6)
            epochs = np.mean([found[f"epoch{e}_{name}"] for e in range(3)], 0)
            np.testing.assert_allclose(found[f"swa_{name}"], epochs, rtol=1e-5, atol=1e-6)
        shard = X[rank::2]  # shard's rows: rank, rank + 2, ...
        weight, bias = found["swa_fc1_weight"], found["swa_fc1_bias"]
        h = [shard[i : i + 20] @ weight.T + bias for i in range(0, 60, 20)]
        np.testing.assert_allclose(
            found["swa_aux_bn1_moving_mean"],
            np.mean([b.mean(0) for b in h], 0),
            rtol=1e-4,
            atol=1e-5,
        )
    for name in names:  # dist_sync: one model, one average
        np.testing.assert_array_equal(ranks[0][f"ema_{name}"], ranks[1][f"ema_{name}"])
    folder = latest_checkpoint(str(tmp_path / "run"))
    saved = mx.nd.load(f"{folder.path}/ema-0003.params")
    for name in names:
        np.testing.assert_array_equal(saved[f"arg:{name}"].asnumpy(), ranks[0][f"ema_{name}"])
