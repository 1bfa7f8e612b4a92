"""``mxoid launch`` past one machine: SSH hosts (stand-ins served by a real sshd) and SLURM.

The stand-in hosts are 127.0.0.2 and 127.0.0.3, served by an sshd this module
starts itself (tests/distributed/scripts/sshd.py). A 2-worker, 1-server
dist_sync job over both, and the same job started as SLURM tasks by hand,
must equal the same job launched on one host, bit for bit.
"""

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

from mxoid.distributed.hosts import Host, HostError, parse_host_file, place, remote_argv
from mxoid.distributed.launch import main
from mxoid.distributed.slurm import SlurmError, expand_nodelist, slurm_port, slurm_task

SCRIPTS = Path(__file__).parent / "scripts"
sys.path.insert(0, str(SCRIPTS))

from jobs import ROOT, job_environment, marked_processes, run_job  # noqa: E402
from sshd import stand_in_hosts  # noqa: E402

WORKER = [sys.executable, SCRIPTS / "dist_worker.py"]
CARRIED = ["MXOID_TEST_MARKER", "PYTHONPATH", "OMP_NUM_THREADS", "MXNET_CPU_WORKER_NTHREADS"]


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    with stand_in_hosts(tmp_path_factory.mktemp("sshd")) as stand_ins:
        yield stand_ins


def params_and_reports(out):
    found = {}
    for rank in range(2):
        with np.load(out / f"rank{rank}.npz") as saved:
            params = {name: saved[name] for name in saved.files}
        found[rank] = (params, json.loads((out / f"rank{rank}.json").read_text()))
    return found


@pytest.fixture(scope="module")
def one_host(tmp_path_factory):
    """The dist_sync job of dist_worker.py launched on 127.0.0.1: each rank's results."""
    out = tmp_path_factory.mktemp("one_host")
    with pytest.MonkeyPatch.context() as patch, job_environment(patch):
        job = run_job(out, WORKER + ["--out", out], timeout=120)
    assert job.status == 0, job
    return params_and_reports(out)


def assert_same_job(found, expected):
    for rank in range(2):
        params, report = found[rank]
        assert params.keys() == expected[rank][0].keys()
        for name in params:
            assert np.array_equal(params[name], expected[rank][0][name]), (rank, name)
        # The evaluation's records to 1e-7: the fused metric operator and MXNet's own
        # (mxoid.metrics.native, chosen per process as the library is at hand) differ in
        # the 8th digit of the cross-entropy; the parameters are bit for bit.
        records = expected[rank][1]["records"]
        assert report["records"].keys() == records.keys()
        for iteration, row in report["records"].items():
            assert row.keys() == records[iteration].keys()
            for name, value in row.items():
                wanted = records[iteration][name]
                if isinstance(value, str):
                    assert value == wanted, (iteration, name)
                else:
                    assert value == pytest.approx(wanted, rel=1e-7), (iteration, name)
        assert report["holds_servers"]


# --------------------------------------------------------------------- host files, placement
def test_a_host_file_has_hosts_and_ports_comments_and_blank_lines(tmp_path):
    path = tmp_path / "hosts"
    path.write_text("# two hosts\n\n127.0.0.2:2222  # the first\n  localhost slots=4\n")
    assert parse_host_file(str(path)) == [
        Host("127.0.0.2", 2222, "127.0.0.2"),
        Host("localhost", None, "127.0.0.1"),
    ]
    assert [str(h) for h in place(parse_host_file(str(path)), 3)] == [
        "127.0.0.2",
        "localhost",
        "127.0.0.2",
    ]


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "names no host"),
        ("a b\n", "line 1: one host a line"),
        ("\nhost:ssh\n", "line 2: 'host:ssh' is not HOST or HOST:SSH_PORT"),
        ("no-such-host.invalid\n", "cannot resolve 'no-such-host.invalid'"),
    ],
)
def test_a_bad_host_file_is_refused_saying_where(tmp_path, text, message):
    path = tmp_path / "hosts"
    path.write_text(text)
    with pytest.raises(HostError, match=message):
        parse_host_file(str(path))


def test_the_remote_command_quotes_every_word_and_sets_variables_with_env():
    argv = remote_argv(
        ["ssh", "-i", "key"], Host("h", 22, "10.0.0.1"), {"A": "x y"}, ["python", "it's.py"]
    )
    assert argv[:3] == ["ssh", "-i", "key"] and "BatchMode=yes" in argv
    assert argv[-3:] == ["22", "h", "env 'A=x y' python 'it'\"'\"'s.py'"]


# ------------------------------------------------------------------------------ SLURM
@pytest.mark.parametrize(
    "listed, names",
    [
        ("node[01-03,07]", ["node01", "node02", "node03", "node07"]),
        ("gpu7", ["gpu7"]),
        ("a[1-2],b,c[09-10]", ["a1", "a2", "b", "c09", "c10"]),
        ("rack[1-2]-n[3,5]", ["rack1-n3", "rack1-n5", "rack2-n3", "rack2-n5"]),
        ("n[098-100]", ["n098", "n099", "n100"]),
    ],
)
def test_node_lists_expand_as_slurm_writes_them(listed, names):
    assert expand_nodelist(listed) == names


@pytest.mark.parametrize("listed", ["node[01-03", "node[3-1]", "node[a-b]"])
def test_a_bad_node_list_is_an_error(listed):
    with pytest.raises(SlurmError):
        expand_nodelist(listed)


def slurm_env(procid, ntasks=4, job="4242", **more):
    return {
        "SLURM_PROCID": str(procid),
        "SLURM_NTASKS": str(ntasks),
        "SLURM_JOB_ID": job,
        "SLURM_STEP_ID": "0",
        "SLURM_STEP_NODELIST": "localhost",
        "SLURMD_NODENAME": "localhost",
        **more,
    }


def test_slurm_tasks_take_their_roles_from_their_procid():
    roles = [slurm_task(slurm_env(i, 5), None, 2)[:2] for i in range(5)]
    assert roles == [("scheduler", 0), ("server", 0), ("server", 1), ("worker", 0), ("worker", 1)]
    variables = slurm_task(slurm_env(3, 5), None, 2)[2]
    assert variables["DMLC_PS_ROOT_URI"] == variables["DMLC_NODE_HOST"] == "127.0.0.1"
    assert variables["DMLC_NUM_WORKER"] == "2" and variables["DMLC_NUM_SERVER"] == "2"
    ports = {slurm_task(slurm_env(i, 5), 2, 2)[2]["DMLC_PS_ROOT_PORT"] for i in range(5)}
    assert ports == {str(slurm_port(slurm_env(0)))}  # every task agrees, alone
    assert slurm_port(slurm_env(0, job="4243")) != slurm_port(slurm_env(0))
    assert slurm_port(slurm_env(0, SLURM_STEP_RESV_PORTS="12000-12004")) == 12000


def test_a_wrong_slurm_task_count_is_an_error_on_every_task(tmp_path):
    command = [sys.executable, "-m", "mxoid.distributed.launch", "--slurm", "-n", "2", "--"]
    tasks = [
        subprocess.Popen(
            [*command, sys.executable, "-c", "print('ran')"],
            env={**os.environ, **slurm_env(i, ntasks=3)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        for i in range(3)
    ]
    for index, task in enumerate(tasks):
        out, err = task.communicate(timeout=60)
        assert task.returncode == 2 and not out
        assert f"(task {index}): error: srun started 3 tasks, but the job needs" in err
        assert "= 4: run srun --ntasks=4" in err


def test_a_slurm_job_started_by_hand_equals_the_job_launched_on_one_host(
    tmp_path, job_env, one_host
):
    """The four tasks of srun -n 4, started with the variables srun sets."""
    job_id = str(uuid.uuid4().int % 10**6)
    command = [sys.executable, "-m", "mxoid.distributed.launch", "--slurm", "-n", "2", "-s", "1"]
    command += ["--", *map(str, WORKER), "--out", str(tmp_path)]
    tasks = []
    for procid in range(4):
        env = {**os.environ, **slurm_env(procid, job=job_id)}
        env.update(SLURM_LOCALID=str(procid), SLURM_NODEID="0", SLURM_STEP_NUM_TASKS="4")
        env["SLURM_JOB_NODELIST"] = env["SLURM_STEP_NODELIST"]
        tasks.append(
            subprocess.Popen(
                command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
        )
    outputs = []
    try:
        for task in tasks:
            outputs.append(task.communicate(timeout=120)[0])
    finally:
        for task in tasks:
            if task.poll() is None:
                task.kill()
    assert [task.returncode for task in tasks] == [0] * 4, "\n".join(outputs)
    assert "task 0 on localhost is scheduler 0" in outputs[0]
    assert "task 3 on localhost is worker 1" in outputs[3]
    assert_same_job(params_and_reports(tmp_path), one_host)


# ------------------------------------------------------------------------------ SSH
def test_a_job_over_two_ssh_hosts_equals_the_same_job_on_one_host(
    tmp_path, job_env, hosts, one_host
):
    job = run_job(
        tmp_path,
        WORKER + ["--out", tmp_path],
        timeout=120,
        hosts=str(hosts.host_file),
        ssh_command=hosts.ssh_command,
        env=CARRIED,
    )
    assert job.status == 0, job
    found = params_and_reports(tmp_path)
    assert_same_job(found, one_host)
    # Each worker ran through SSH on its own stand-in host, and ps-lite bound that address.
    where = sorted(
        (report["ssh_connection"].split()[2], report["node_host"]) for _, report in found.values()
    )
    assert where == [("127.0.0.2", "127.0.0.2"), ("127.0.0.3", "127.0.0.3")], found
    # ps-lite ranks the hosts in descending order of their address: worker 1 (on 127.0.0.3)
    # is rank 0. Its first line carries its launch index; once MainLoop is built it has
    # told its rank, and the launcher labels it so from there (and says so).
    assert "[worker 1 on 127.0.0.3] rank 0 of 2" in job.stdout, job
    assert "worker 1 on 127.0.0.3 (ssh pid " in job.stderr, job
    assert "has rank 0: its lines read [worker 0 on 127.0.0.3] now" in job.stderr, job
    assert "[worker 0 on 127.0.0.3] rank 0 done" in job.stdout, job
    assert "[worker 1 on 127.0.0.2] rank 1 done" in job.stdout, job
    assert "mxoid-agent" not in job.stdout + job.stderr  # the agents' lines for the launcher


def test_an_unreachable_host_fails_before_anything_starts_naming_it(tmp_path, job_env, hosts):
    bad = tmp_path / "hosts"
    bad.write_text(f"127.0.0.2:{hosts.port}\n127.0.0.3:1\n")  # nothing listens on port 1
    start = time.monotonic()
    job = run_job(
        tmp_path,
        ["true"],
        hosts=str(bad),
        ssh_command=hosts.ssh_command,
        env=CARRIED,
    )
    assert job.status == 1 and time.monotonic() - start < 30, job
    assert "host 127.0.0.3: cannot log in through SSH without a prompt" in job.stderr, job
    assert "ssh-copy-id 127.0.0.3" in job.stderr
    assert not marked_processes(job_env)


def test_a_host_without_the_key_fails_before_anything_starts(tmp_path, job_env, hosts):
    job = run_job(
        tmp_path,
        ["true"],
        hosts=str(hosts.host_file),
        ssh_command=hosts.ssh_command.replace("client_key", "host_key"),  # the wrong key
        env=CARRIED,
    )
    assert job.status == 1, job
    assert "host 127.0.0.2: cannot log in through SSH without a prompt" in job.stderr, job
    assert "Permission denied" in job.stderr


@pytest.mark.parametrize(
    "argv, message",
    [
        (["-n", "2", "--env", "A", "--", "python"], "go with -H HOSTFILE"),
        (["-n", "2", "-H", "/nonexistent", "--", "python"], "-H /nonexistent: no such file"),
        (["--slurm", "-H", "hosts", "--", "python"], "--slurm and --hosts exclude each other"),
    ],
)
def test_main_rejects_bad_multi_host_arguments(capsys, argv, message):
    with pytest.raises(SystemExit) as raised:
        main(argv)
    assert raised.value.code == 2
    assert message in capsys.readouterr().err
