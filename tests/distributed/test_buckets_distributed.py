"""Bucketing under dist_sync: workers whose batches fall into other buckets."""

import sys
from pathlib import Path

import numpy as np

SCRIPTS = Path(__file__).parent / "scripts"
sys.path.insert(0, str(SCRIPTS))

from jobs import run_job  # noqa: E402


def test_workers_with_batches_in_other_buckets_take_the_same_steps(tmp_path, job_env):
    """Rank 0 trains buckets 4 and 8, rank 1 buckets 8 and 12 (the default one): as many
    batches each, so the same steps, and the same parameters at the end."""
    job = run_job(tmp_path, [sys.executable, SCRIPTS / "bucket_worker.py", "--out", tmp_path])
    assert job.status == 0, job
    steps = [(tmp_path / f"rank{r}.steps").read_text() for r in range(2)]
    assert steps == ["16 [4, 8]", "16 [8]"]  # 8 batches an epoch, 2 epochs; 12 is the default
    first, second = (dict(np.load(tmp_path / f"rank{r}.npz")) for r in range(2))
    for name in first:
        np.testing.assert_array_equal(first[name], second[name], err_msg=name)
