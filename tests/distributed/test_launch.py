"""``mxoid launch``: output, exit status, teardown, timeouts, port retry, a killed launcher.

The workers here are small Python programs that never create a kvstore, so
the scheduler and servers wait for them until the launcher stops them.
"""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import mxoid.distributed.processes as launch_processes
from mxoid.distributed.launch import main

sys.path.insert(0, str(Path(__file__).parent / "scripts"))

from jobs import ROOT, marked_processes, run_job

PYTHON = sys.executable


def python(code):
    return [PYTHON, "-c", code]


def test_output_is_prefixed_and_the_status_is_the_workers(tmp_path, job_env):
    job = run_job(
        tmp_path,
        python(
            "import sys; print('to stdout'); print('partial', end=''); "
            "print('to stderr', file=sys.stderr)"
        ),
    )
    assert job.status == 0, job
    for index in (0, 1):
        assert f"[worker {index}] to stdout\n" in job.stdout
        assert f"[worker {index}] partial\n" in job.stdout  # an unfinished last line too
        assert f"[worker {index}] to stderr\n" in job.stderr
    assert "workers finished; stopped scheduler, server 0" in job.stderr


@pytest.mark.parametrize("workers, servers", [(3, 2), (5, 1), (1, 4)])
def test_each_role_gets_distinct_ascending_ports_in_launch_order(workers, servers):
    """ps-lite ranks the nodes of one host by port: the launcher gives the i-th worker (and
    server) the i-th smallest of its role's ports, drawn once a role, all different."""
    job = launch_processes.Job(workers, servers, 1.0, sys.stdout.buffer, sys.stderr.buffer)
    for role, count in (("worker", workers), ("server", servers)):
        ports = [int(job.environment(None, role, index=i)["PORT"]) for i in range(count)]
        assert ports == sorted(ports) and len(set(ports)) == count, (role, ports)
        again = [int(job.environment(None, role, index=i)["PORT"]) for i in range(count)]
        assert again == ports  # one draw a role: a later process cannot take another's
    assert "PORT" not in job.environment(None, "scheduler")  # it binds DMLC_PS_ROOT_PORT


def test_a_workers_lines_are_labelled_with_its_rank_on_one_host(tmp_path, job_env):
    # ps-lite's scheduler ranks the workers of one host by port: the launcher gives them
    # ascending ports in launch order, so each worker's label is its rank (kv.rank).
    code = (
        "from mxoid.update import create_kvstore; kv, _ = create_kvstore('dist_sync', 1); "
        "print('kv.rank', kv.rank)"
    )
    job = run_job(tmp_path, python(code), workers=3, servers=2)
    assert job.status == 0, job
    for rank in range(3):
        assert f"[worker {rank}] kv.rank {rank}\n" in job.stdout, job
    assert "mxoid-agent" not in job.stdout + job.stderr and "has rank" not in job.stderr


def test_a_failing_worker_gives_its_status_and_one_reason(tmp_path, job_env):
    job = run_job(tmp_path, python("import sys; sys.exit(3)"), servers=2)
    assert job.status == 3, job
    last_line = job.stderr.strip().splitlines()[-1]
    assert last_line.startswith("mxoid launch: worker ")
    assert "exited with status 3; stopped " in last_line
    assert job.seconds < 30


def test_a_missing_command_fails_cleanly(tmp_path, job_env):
    job = run_job(tmp_path, ["/nonexistent/program"])
    assert job.status == 1, job
    assert "cannot run '/nonexistent/program'" in job.stderr


def test_timeout_stops_everything(tmp_path, job_env):
    job = run_job(tmp_path, python("import time; time.sleep(120)"), timeout=3)
    assert job.status == 124, job
    assert "timed out (--timeout)" in job.stderr
    assert job.seconds < 3 + 2 * 1.0 + 10  # the timeout, two grace periods, some slack


def test_stall_timeout_stops_a_job_where_nothing_happens(tmp_path, job_env):
    job = run_job(
        tmp_path,
        python("import time; print('started', flush=True); time.sleep(120)"),
        stall_timeout=2,
    )
    assert job.status == 124, job
    assert "stalled: no output and no CPU time used for 2 s" in job.stderr
    assert job.seconds < 60


def test_the_scheduler_port_is_found_again_when_taken(tmp_path, job_env, monkeypatch):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    ports = iter([port])
    real = launch_processes.free_port
    monkeypatch.setattr(launch_processes, "free_port", lambda: next(ports, None) or real())
    try:
        job = run_job(tmp_path, python("print('ran')"))
    finally:
        taken.close()
    assert job.status == 0, job
    assert f"the scheduler could not bind port {port}; trying another port" in job.stderr
    assert "[worker 1] ran" in job.stdout


def test_children_die_with_a_killed_launcher(tmp_path, job_env):
    ready = tmp_path / "ready"
    worker = (
        "import os, sys, time; open(sys.argv[1] + str(os.getpid()), 'w').close(); time.sleep(120)"
    )
    launcher = subprocess.Popen(
        [
            PYTHON,
            "-m",
            "mxoid.launch",
            "-n",
            "2",
            "--timeout",
            "120",
            "--",
            PYTHON,
            "-c",
            worker,
            str(ready),
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while len(list(tmp_path.glob("ready*"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(list(tmp_path.glob("ready*"))) == 2, "the workers did not start"
        assert len(marked_processes(job_env)) >= 4  # launcher, scheduler, server, 2 workers
    finally:
        launcher.kill()
        launcher.wait(timeout=30)
    deadline = time.monotonic() + 10
    while marked_processes(job_env) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not marked_processes(job_env)


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["--hosts", "hosts.txt", "-n", "2", "--", "python", "train.py"],
            "-H hosts.txt: no such file",
        ),
        (["--", "python", "train.py"], "give the number of workers"),
        (["-n", "2"], "give the worker command after '--'"),
        (["-n", "2", "-s", "0", "--", "python"], "-s SERVERS must be at least 1"),
        (["-n", "2", "--timeout", "0", "--", "python"], "--timeout must be positive"),
    ],
)
def test_main_rejects_bad_arguments(capsys, argv, message):
    with pytest.raises(SystemExit) as raised:
        main(argv)
    assert raised.value.code == 2
    assert message in capsys.readouterr().err


def test_launch_restores_the_signal_handlers(tmp_path, job_env):
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    run_job(tmp_path, python("pass"), workers=1)
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before
    assert os.environ.get("DMLC_ROLE") is None
