"""Building the fused metric operator: once per machine, never on a loop's critical path.

A first loop on a machine starts the build in a process of its own, says so in one log
line and trains with MXNet's operators; later loops (in that process or others) load
the library in milliseconds. ``mxoid native`` builds it ahead of time. Builds that fail
are recorded, and every later process says why instead of compiling again.
"""

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time

import pytest

from mxoid import operator_cache

HAS_COMPILER = bool(os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++"))
needs_compiler = pytest.mark.skipif(
    not HAS_COMPILER, reason="no C++ compiler here: the fused operator cannot be built"
)
ANNOUNCEMENT = "building its fused metric operator"

PROBE = textwrap.dedent(
    """
    import json, os
    from mxoid.metrics import native
    ok = native.build()
    path = native.library_path()
    print(json.dumps({"ok": ok, "reason": native.unavailable_reason(),
                      "path": path, "exists": bool(path and os.path.exists(path))}))
    """
)


def _own(folder):
    """The folder's files but the one of MXNet's compiled operator functions, which shares
    the cache folder (mxoid/operator_cache.py, tested in tests/test_operator_cache.py)."""
    if not folder.exists():
        return []
    return [p for p in folder.iterdir() if p.name != os.path.basename(operator_cache.cache_file())]


TARGET = (
    "import json; from mxoid.metrics import native; print(json.dumps(native._request()['target']))"
)


def _start_probe(**env):
    """Start a fresh Python that builds the operator (see :func:`_probe_result`)."""
    environment = {**os.environ, "OMP_NUM_THREADS": "1", **env}
    return subprocess.Popen(
        [sys.executable, "-c", PROBE],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=environment,
    )


def _probe_result(process):
    stdout, stderr = process.communicate(timeout=600)
    assert process.returncode == 0, stderr[-3000:]
    return json.loads(stdout.strip().splitlines()[-1])


def _probe(**env):
    """Run a fresh Python that builds the operator; return what it reports."""
    return _probe_result(_start_probe(**env))


@needs_compiler
def test_processes_that_build_at_the_same_time_each_load_a_whole_library(tmp_path):
    """One builds (it holds the claim) under a name of its own and renames it into place;
    the others wait for it: none loads a half-written file, and the cache ends with one
    library and no partial files. The claim a killed build left (older than two build
    timeouts) blocks none of them."""
    cache = tmp_path / "cache"
    target = json.loads(
        subprocess.check_output(
            [sys.executable, "-c", TARGET], env={**os.environ, "MXOID_CACHE_DIR": str(cache)}
        )
    )
    claim = cache / (os.path.basename(target) + ".building")
    claim.write_text("12345\n")
    os.utime(claim, (0, 0))
    probes = [_start_probe(MXOID_CACHE_DIR=str(cache)) for _ in range(3)]
    results = [_probe_result(p) for p in probes]
    assert all(r["ok"] for r in results), results
    assert {r["path"] for r in results} == {target} and not claim.exists()
    assert [p.name for p in _own(cache)] == [os.path.basename(results[0]["path"])]


@needs_compiler
def test_the_library_is_built_once_into_the_cache_and_loaded_from_there(tmp_path):
    """Built into ~/.cache/mxoid; $XDG_CACHE_HOME/mxoid and MXOID_CACHE_DIR name the same
    place here, where the library built before is loaded, with no compiler to build it."""
    home = tmp_path / "home"
    clean = {"HOME": str(home), "XDG_CACHE_HOME": "", "MXOID_CACHE_DIR": ""}
    built = _probe(**clean)
    cache = home / ".cache" / "mxoid"
    assert built["ok"] and built["exists"] and built["path"].startswith(str(cache) + os.sep)
    assert [p.name for p in _own(cache)] == [os.path.basename(built["path"])]  # no leftovers
    for where in ({"XDG_CACHE_HOME": str(home / ".cache")}, {"MXOID_CACHE_DIR": str(cache)}):
        again = _probe(**{**clean, "HOME": str(tmp_path / "elsewhere"), **where})
        assert again["ok"] and again["path"] == built["path"]
    no_compiler = _probe(**clean, CXX="/bin/false")
    assert no_compiler["ok"] and no_compiler["path"] == built["path"]
    # A build killed long ago left its partial file: the next build removes it.
    abandoned = cache / ".building-killed.so"
    abandoned.write_bytes(b"half")
    os.utime(abandoned, (0, 0))
    with open(built["path"], "r+b") as f:  # a damaged library: reported, and not used
        f.truncate(100)
    damaged = _probe(**clean, CXX="/bin/false")
    assert not damaged["ok"] and "could not load" in damaged["reason"]
    assert "delete it to build it again" in damaged["reason"]
    os.unlink(built["path"])
    rebuilt = _probe(**clean)
    assert rebuilt["ok"] and rebuilt["path"] == built["path"] and not abandoned.exists()


def _counting_compiler(tmp_path, status):
    """A compiler that appends a line to a file each time it runs, then exits with ``status``."""
    counter = tmp_path / f"runs-{status}"
    script = tmp_path / f"cc-{status}"
    script.write_text(f"#!/bin/sh\necho run >> {counter}\nexit {status}\n")
    script.chmod(0o755)
    return str(script), counter


def test_without_the_operator_the_reason_is_given_and_a_failure_is_not_tried_again(tmp_path):
    off = _probe(MXOID_NATIVE="0", MXOID_CACHE_DIR=str(tmp_path / "off"))
    assert not off["ok"] and off["reason"] == "MXOID_NATIVE=0" and _own(tmp_path / "off") == []
    failing, runs = _counting_compiler(tmp_path, 1)
    broken = _probe(MXOID_CACHE_DIR=str(tmp_path / "broken"), CXX=failing)
    assert not broken["ok"] and f"{failing} failed (status 1)" in broken["reason"]
    (record,) = _own(tmp_path / "broken")  # no partial file: the failure's record
    assert record.name.endswith(".so.failed") and runs.read_text() == "run\n"
    again = _probe(MXOID_CACHE_DIR=str(tmp_path / "broken"), CXX=failing)
    assert not again["ok"] and f"{failing} failed (status 1)" in again["reason"]
    assert f"remove {tmp_path / 'broken'}" in again["reason"] and "to try again" in again["reason"]
    assert runs.read_text() == "run\n"  # the record is read: not compiled again
    other, other_runs = _counting_compiler(tmp_path, 2)  # another compiler is tried
    third = _probe(MXOID_CACHE_DIR=str(tmp_path / "broken"), CXX=other)
    assert "failed (status 2)" in third["reason"] and other_runs.read_text() == "run\n"
    missing = _probe(MXOID_CACHE_DIR=str(tmp_path / "m"), CXX=str(tmp_path / "no-cc"))
    assert not missing["ok"] and "failed to run" in missing["reason"]
    (tmp_path / "file").write_text("")
    unwritable = _probe(MXOID_CACHE_DIR=str(tmp_path / "file" / "cache"))
    assert not unwritable["ok"] and "cannot write to the cache directory" in unwritable["reason"]


MONITORED_RUN = textwrap.dedent(
    """
    import json, time
    import mxnet as mx, numpy as np
    from mxoid import MainLoop, FinishAfter, TrainingMonitoring
    from mxoid.metrics import native
    X = np.random.RandomState(0).rand(40, 5).astype("float32")
    y = (X[:, 0] > 0.5).astype("float32")

    def train():
        net = mx.sym.SoftmaxOutput(mx.sym.FullyConnected(mx.sym.var("data"), num_hidden=2),
                                   name="softmax")
        it = mx.io.NDArrayIter(X, y, batch_size=10, label_name="softmax_label")
        mx.random.seed(0)
        loop = MainLoop(net, it, extensions=[TrainingMonitoring(["acc", "ce"]),
                                             FinishAfter(after_n_epochs=1)])
        fused = "mxoid_metric" in loop.manager.training_set.bound_symbol.tojson()
        reason = native.unavailable_reason()
        loop.run()
        return {"fused": fused, "reason": reason,
                "accuracy": loop.log.last("train_accuracy"),
                "cross_entropy": loop.log.last("train_cross_entropy")}

    runs = [train()]
    deadline = time.monotonic() + float(__import__("sys").argv[1])
    while not native.available() and native.unavailable_reason() is not None \\
            and "being built" in native.unavailable_reason() and time.monotonic() < deadline:
        time.sleep(0.2)
    runs.append(train())
    print(json.dumps(runs))
    """
)


def _monitored_runs(cache, wait_s, **env):
    """Two monitored loops in a fresh Python, the second once the build is done (at most
    ``wait_s`` later); return (their reports, standard error)."""
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "MXOID_CACHE_DIR": str(cache), **env}
    done = subprocess.run(
        [sys.executable, "-c", MONITORED_RUN, str(wait_s)],
        capture_output=True,
        text=True,
        env=environment,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


@needs_compiler
def test_the_first_loop_builds_in_the_background_says_so_once_and_trains_meanwhile(tmp_path):
    """On a machine without the library, the first MainLoop does not wait for the compiler:
    it announces the build in one log line
    and computes its metrics with MXNet's operators. Once the build is done, the next loop
    of that process, and every later process, use the operator, unannounced, with the
    same records."""
    cache = tmp_path / "cache"
    (first, then), stderr = _monitored_runs(cache, 300)
    assert stderr.count(ANNOUNCEMENT) == 1, stderr
    assert "'mxoid native' builds it ahead of time" in stderr
    assert not first["fused"] and "being built" in first["reason"]
    assert then["fused"] and then["reason"] is None
    (library,) = _own(cache)
    assert library.suffix == ".so"
    (later, _), stderr = _monitored_runs(cache, 0)
    assert ANNOUNCEMENT not in stderr and later["fused"]
    for run in (then, later):
        assert (run["accuracy"], run["cross_entropy"]) == (
            first["accuracy"],
            first["cross_entropy"],
        )


def test_a_failed_background_build_falls_back_and_is_reported_to_every_later_process(tmp_path):
    """With a compiler that fails, the first loop announces the build and trains with
    MXNet's operators; the failure is recorded, and later loops say why, train the same,
    and neither compile nor announce again."""
    cache = tmp_path / "cache"
    failing, runs = _counting_compiler(tmp_path, 1)
    (first, then), stderr = _monitored_runs(cache, 60, CXX=failing)
    assert stderr.count(ANNOUNCEMENT) == 1, stderr
    assert not first["fused"] and not then["fused"]
    assert "failed (status 1)" in then["reason"] and "to try again" in then["reason"]
    assert runs.read_text() == "run\n"
    (later, _), stderr = _monitored_runs(cache, 0, CXX=failing)
    assert ANNOUNCEMENT not in stderr and not later["fused"]
    assert "failed (status 1)" in later["reason"] and runs.read_text() == "run\n"
    for run in (then, later):
        assert (run["accuracy"], run["cross_entropy"]) == (
            first["accuracy"],
            first["cross_entropy"],
        )
        assert 0 <= run["accuracy"] <= 1 and run["cross_entropy"] > 0


def _mxoid(*args, **env):
    environment = {**os.environ, "OMP_NUM_THREADS": "1", **env}
    return subprocess.run(
        [sys.executable, "-m", "mxoid", *args],
        capture_output=True,
        text=True,
        env=environment,
        timeout=600,
    )


@needs_compiler
def test_mxoid_native_builds_ahead_of_time_and_says_why_it_cannot(tmp_path):
    built = _mxoid("native", MXOID_CACHE_DIR=str(tmp_path / "cache"))
    assert built.returncode == 0, built.stderr
    (library,) = _own(tmp_path / "cache")
    assert f"built and loads: {library}" in built.stdout and ANNOUNCEMENT not in built.stderr
    (_, _), stderr = _monitored_runs(tmp_path / "cache", 0)
    assert ANNOUNCEMENT not in stderr
    failed = _mxoid("native", MXOID_CACHE_DIR=str(tmp_path / "other"), CXX="/bin/false")
    assert failed.returncode == 1 and failed.stdout == ""
    assert "mxoid native: error: the fused metric operator is unavailable" in failed.stderr
    assert "/bin/false failed (status 1)" in failed.stderr


def test_a_background_build_never_outlives_the_script_by_more_than_a_second(tmp_path):
    """A script that ends while its loop's background build runs stops it: the builder and
    its compiler are gone within a second of the script's end, with no claim and no partial
    file left, so that the next script builds at once (issue 40: the compiler ran on ~20 s
    after a first script had ended)."""
    cache = tmp_path / "cache"
    compiler = tmp_path / "slow-cc"  # a compiler that takes its time, as a real one does
    compiler.write_text(f"#!/bin/sh\necho $$ > {tmp_path / 'cc.pid'}\nsleep 60\n")
    compiler.chmod(0o755)
    script = textwrap.dedent(
        """
        import json, os, time
        from mxoid.metrics import native
        assert not native.available()
        while not os.path.exists(os.environ["PID_FILE"]):  # the compiler has started
            time.sleep(0.05)
        print(json.dumps({"builder": native._background[0].pid}), flush=True)
        """
    )
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "MXOID_CACHE_DIR": str(cache),
        "CXX": str(compiler),
        "PID_FILE": str(tmp_path / "cc.pid"),
    }
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120
    )
    ended = time.monotonic()
    assert done.returncode == 0, done.stderr[-3000:]
    assert ANNOUNCEMENT in done.stderr and "stopped if this script ends first" in done.stderr
    builder = json.loads(done.stdout.strip().splitlines()[-1])["builder"]
    while _group(builder) and time.monotonic() < ended + 1.0:
        time.sleep(0.02)
    left = _group(builder)  # the builder, the compiler and the compiler's own children
    assert not left, f"processes {left} outlived the script by over a second"
    assert sorted(p.name for p in _own(cache)) == []  # no claim, no partial, no failure


def _group(leader):
    """The live processes of process group ``leader`` (zombies, dead but unreaped, aside)."""
    members = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(") ", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z" and int(fields[2]) == leader:
                members.append(int(entry))
    return members
