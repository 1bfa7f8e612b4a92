"""Loss scaling under dist_sync: every worker skips the same steps, and a power-of-two scale
trains bit for bit as none.

Two workers on MXNet's loopback dist_sync kvstore (one server), the optimizer on the servers
(the workers agree on each step through the kvstore before the push) or on the workers (each
checks the gradients summed over the workers, the same numbers everywhere).
"""

import json
import sys
from pathlib import Path

import numpy as np
import pytest

SCRIPTS = Path(__file__).parent / "scripts"
sys.path.insert(0, str(SCRIPTS))

from jobs import run_job  # noqa: E402


def train(tmp_path, name, where, scale, poison=0, kvstore="dist_sync"):
    out = tmp_path / name
    out.mkdir()
    command = [sys.executable, SCRIPTS / "loss_scale_worker.py", "--out", out, "--scale", scale]
    command += ["--poison", str(poison), "--kvstore", kvstore]
    if where == "workers":
        command.append("--update-on-workers")
    job = run_job(out, command)
    if kvstore == "dist_async":
        return job
    assert job.status == 0, job
    reports = [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(2)]
    params = [dict(np.load(out / f"rank{rank}.npz")) for rank in range(2)]
    for report in reports:
        assert report["update_on_kvstore"] is (where == "servers")
    return reports, params


def assert_same(ours, theirs):
    assert ours.keys() == theirs.keys()
    for name in ours:
        np.testing.assert_array_equal(ours[name], theirs[name], err_msg=name)


@pytest.mark.parametrize("where", ["servers", "workers"])
def test_a_power_of_two_scale_trains_bit_for_bit_as_none(tmp_path, job_env, where):
    """Dynamic, from 2**10 doubled every 4 steps (12 steps): each worker's parameters as
    without loss scaling, bit for bit."""
    _, plain = train(tmp_path, "none", where, "none")
    reports, params = train(tmp_path, "dynamic", where, "dynamic")
    for rank in range(2):
        assert_same(params[rank], plain[rank])
        assert reports[rank]["skipped"][-1] == 0
        assert reports[rank]["loss_scale"] == 2.0**13


@pytest.mark.parametrize("where", ["servers", "workers"])
def test_an_overflow_on_one_worker_skips_the_step_on_both(tmp_path, job_env, where):
    """Rank 1's 6th batch holds an inf: both workers skip step 6, halve the scale, go on."""
    reports, params = train(tmp_path, "poisoned", where, "dynamic", poison=6)
    for report in reports:
        assert report["skipped"] == [0] * 5 + [1] * 7
        assert report["updates"] == 11
    assert reports[0]["loss_scale"] == reports[1]["loss_scale"]
    assert_same(params[0], params[1])
    for values in params[0].values():
        assert np.isfinite(values).all()


def test_dist_async_is_refused_with_the_reason_and_the_fix(tmp_path, job_env):
    job = train(tmp_path, "async", "servers", "dynamic", kvstore="dist_async")
    assert job.status != 0
    output = job.stdout + job.stderr
    assert "with the kvstore 'dist_async'" in output and "Use kvstore='dist_sync'" in output
