"""``mxoid launch --slurm``: tasks that are wrong, or disagree, or cannot bind, end every task.

The tasks are started by hand with the variables srun sets (no SLURM daemon),
as in test_hosts.py. Each case must end every task within the bound the
README states (``--check-timeout`` + 10 s), with a non-zero status and the
message on every task, and leave no process behind (the marker scan of
jobs.py).
"""

import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mxoid.distributed.slurm import SlurmError, slurm_port, slurm_task

sys.path.insert(0, str(Path(__file__).parent / "scripts"))

from jobs import ROOT, marked_processes  # noqa: E402

CHECK_TIMEOUT = 20
BOUND = CHECK_TIMEOUT + 10  # the README's bound
LAUNCH = [sys.executable, "-m", "mxoid.distributed.launch", "--slurm"]
SLEEPER = [sys.executable, "-c", "import time; time.sleep(120)"]


def slurm_env(procid, ntasks=4, job="4242", **more):
    return {
        "SLURM_PROCID": str(procid),
        "SLURM_NTASKS": str(ntasks),
        "SLURM_JOB_ID": job,
        "SLURM_STEP_ID": "0",
        "SLURM_STEP_NODELIST": "localhost",
        "SLURM_JOB_NODELIST": "localhost",
        "SLURMD_NODENAME": "localhost",
        **more,
    }


def free_job():
    """A job id whose derived port is free now (tests run in parallel: no fixed port)."""
    while True:
        job = str(random.randrange(10**5, 10**7))
        with socket.socket() as probe:
            try:
                probe.bind(("", slurm_port(slurm_env(0, job=job))))
            except OSError:
                continue
        return job


def start_tasks(envs, *options, command=SLEEPER):
    argv = [*LAUNCH, "--check-timeout", str(CHECK_TIMEOUT), *options, "--", *command]
    return [
        subprocess.Popen(
            argv,
            env={**os.environ, **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        for env in envs
    ]


def ended(tasks):
    """Each task's (status, stderr, seconds from the start), or a failure past the bound."""
    start = time.monotonic()
    found = []
    try:
        for task in tasks:
            _, err = task.communicate(timeout=max(0.1, BOUND - (time.monotonic() - start)))
            found.append((task.returncode, err, time.monotonic() - start))
    finally:
        for task in tasks:
            if task.poll() is None:
                task.kill()
                task.wait()
    return found


@pytest.mark.parametrize(
    "value, message",
    [
        ("two", "SLURM_PROCID is 'two', not an integer"),
        ("7", "SLURM_PROCID 7 is not a task of SLURM_NTASKS 4 (0 to 3)"),
        ("", "SLURM_PROCID not set"),
    ],
)
def test_a_bad_procid_is_named_for_what_it_is(value, message):
    with pytest.raises(SlurmError, match=message.replace("(", r"\(").replace(")", r"\)")):
        slurm_task(slurm_env(value), 2, 1)


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"SLURM_PROCID": "7"}, "SLURM_PROCID 7 is not a task of SLURM_NTASKS 4"),
        ({"SLURM_PROCID": "two"}, "SLURM_PROCID is 'two', not an integer"),
        ({"SLURM_NTASKS": "5"}, "task 3 has SLURM_NTASKS '5' where task 0 has '4'"),
    ],
)
def test_a_wrong_or_disagreeing_task_ends_every_task_with_the_message(job_env, bad, message):
    job = free_job()
    envs = [slurm_env(procid, job=job) for procid in range(4)]
    envs[3].update(bad)
    options = [] if "SLURM_NTASKS" in bad else ["-n", "2"]  # -n 2 would refuse 5 tasks alone
    found = ended(start_tasks(envs, *options))
    for index, (status, err, seconds) in enumerate(found):
        assert status == 2, (index, err)
        assert message in err, (index, err)
        assert seconds < BOUND
        assert "is scheduler" not in err and "is worker" not in err  # nothing started
    assert not marked_processes(job_env)


def test_a_busy_port_is_named_with_the_fix_on_every_task(job_env):
    job = free_job()
    port = slurm_port(slurm_env(0, job=job))
    with socket.socket() as holder:  # another program on the derived port
        holder.bind(("127.0.0.1", port))
        holder.listen(8)
        found = ended(start_tasks([slurm_env(procid, job=job) for procid in range(4)], "-n", "2"))
    for index, (status, err, seconds) in enumerate(found):
        assert status == 2, (index, err)
        assert f"port {port} of " in err and "is in use by another program" in err, (index, err)
        assert "--resv-ports" in err and "DMLC_PS_ROOT_PORT" in err
        assert "bind failed" not in err
        assert seconds < BOUND
    assert not marked_processes(job_env)


def test_the_scheduler_and_servers_end_after_sigterm_once_the_job_has_failed(job_env):
    """The workers die; SIGTERM (as `timeout` or scancel sends) ends the other roles."""
    grace = 2
    job = free_job()
    envs = [slurm_env(procid, job=job) for procid in range(4)]
    tasks = start_tasks(envs, "-n", "2", "--grace", str(grace))
    try:
        deadline = time.monotonic() + 60
        for task in tasks:  # every task announced its role: the check passed
            line = task.stderr.readline()
            assert "mxoid launch --slurm: task" in line or time.monotonic() > deadline, line
        for worker in tasks[2:]:
            worker.kill()
            worker.wait()
        time.sleep(1)
        assert tasks[0].poll() is None and tasks[1].poll() is None  # still serving
        for task in tasks[:2]:
            task.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        for task in tasks[:2]:
            _, err = task.communicate(timeout=grace + 10)
            assert task.returncode == 128 + signal.SIGTERM, err
            assert f"still ran {grace} s after SIGTERM (--grace): ended it" in err
        seconds = time.monotonic() - sent
    finally:
        for task in tasks:
            if task.poll() is None:
                task.kill()
                task.wait()
    assert grace <= seconds < grace + 10
    assert not marked_processes(job_env)
