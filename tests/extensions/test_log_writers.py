"""JSONLinesLog and CSVLog: files that read back as loop.log, across runs and crashes."""

import csv
import json
import math
import os
import subprocess
import sys

import mxnet as mx
import numpy as np
import pytest
from scripted import Script, small_loop
from small_disk import on_small_disk

from mxoid import CSVLog, Extension, FinishAfter, JSONLinesLog, read_log
from mxoid.log.records import plain_value

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
WRITERS = [
    pytest.param(JSONLinesLog, "log.jsonl", id="jsonl"),
    pytest.param(CSVLog, "log.csv", id="csv"),
]


class Records(Extension):
    """After every batch, writes records of many kinds; some appear only later in training."""

    def __init__(self, **kwargs):
        kwargs.setdefault("after_batch", True)
        super().__init__(**kwargs)

    def do(self, which_callback, *args):
        i = self.main_loop.status.iterations_done
        row = self.main_loop.log.current_row
        row["loss"] = 1.0 / i
        row["loss32"] = np.float32(i / 3)
        row["on_device"] = mx.nd.array([i * 0.25])
        if i % 3 == 0:
            row["count"] = i
            row["note"] = f'batch {i}, "quoted"'
        if i == 5:
            row["diverged"] = float("nan")
            row["overflow"] = [1.5, -math.inf]
            row["flag"] = True


def expected_rows(loop):
    """loop.log as a log file holds it: plain values, epochs_done as each row ended."""
    return [
        {
            "iteration": i,
            "epochs_done": min(i // 4, loop.status.epochs_done),
            **{name: plain_value(value) for name, value in row.items()},
        }
        for i, row in loop.log.items()
    ]


def comparable(rows):
    """NaN compares unequal to itself; compare its text instead."""
    return json.loads(json.dumps(rows).replace("NaN", '"nan"'))


@pytest.mark.parametrize("writer, filename", WRITERS)
def test_the_file_reads_back_as_the_log(tmp_path, writer, filename):
    path = tmp_path / filename
    loop = small_loop(
        [Records(), Script("valid_loss", [None, 0.5]), writer(path), FinishAfter(after_n_epochs=2)]
    ).run()
    rows = read_log(path)
    expected = expected_rows(loop)
    assert expected[3]["iteration"] == 4 and expected[3]["valid_loss"] is None
    expected[3].pop("valid_loss")  # JSON keeps a None, CSV cannot tell it from an absent record
    if writer is JSONLinesLog:
        assert rows[3].pop("valid_loss") is None
    assert comparable(rows) == comparable(expected)
    assert [row["iteration"] for row in rows] == list(range(1, 9))
    assert rows[-1]["training_finish_requested"] == "FinishAfter: 2 epochs done"
    assert math.isnan(rows[4]["diverged"]) and rows[4]["overflow"] == [1.5, -math.inf]


@pytest.mark.parametrize("writer, filename", WRITERS)
def test_a_writer_creates_the_folder_of_its_file(tmp_path, writer, filename):
    path = tmp_path / "runs" / "first" / filename
    small_loop([Records(), writer(path), FinishAfter(after_n_epochs=1)]).run()
    assert [row["iteration"] for row in read_log(path)] == [1, 2, 3, 4]


def test_a_csv_whose_columns_appear_over_time_keeps_one_header(tmp_path):
    path = tmp_path / "log.csv"
    small_loop([Records(), CSVLog(path), FinishAfter(after_n_epochs=2)]).run()
    with open(path, newline="") as f:
        lines = list(csv.reader(f))
    assert lines[0][:6] == ["run", "iteration", "epochs_done", "loss", "loss32", "on_device"]
    later = {"count", "note", "diverged", "overflow", "flag", "training_finish_requested"}
    assert later <= set(lines[0])
    assert sum(line[:2] == ["run", "iteration"] for line in lines) == 1
    assert all(len(line) == len(lines[0]) for line in lines)
    assert os.listdir(tmp_path) == ["log.csv"]  # no temporary file left


@pytest.mark.parametrize("writer, filename", WRITERS)
def test_a_second_run_is_appended_as_a_new_run(tmp_path, writer, filename):
    path = tmp_path / filename
    first = small_loop([Records(), writer(path), FinishAfter(after_n_epochs=1)]).run()
    second = small_loop(
        [Records(), Script("extra", [7.5]), writer(path), FinishAfter(after_n_epochs=1)]
    ).run()
    assert comparable(read_log(path)) == comparable(expected_rows(second))
    every = read_log(path, all_runs=True)
    assert [row["run"] for row in every] == [1] * len(first.log) + [2] * len(second.log)
    first_rows = [{k: v for k, v in row.items() if k != "run"} for row in every[: len(first.log)]]
    assert comparable(first_rows) == comparable(expected_rows(first))
    assert "extra" not in every[3] and every[-1]["extra"] == 7.5
    if writer is JSONLinesLog:
        with open(path) as f:
            headers = [json.loads(line) for line in f if line.startswith('{"run"')]
        assert [h["run"] for h in headers] == [1, 2]
        assert all(h["start_iteration"] == 0 for h in headers)
        assert all(h["started"][:2] == "20" for h in headers)


KILLED_RUN = """
import json, os, sys
sys.path[:0] = [{here!r}, {tests!r}, {root!r}]
from mxoid import CSVLog, Extension, FinishAfter, JSONLinesLog
from scripted import small_loop
from test_log_writers import Records, expected_rows

class Kill(Extension):
    def after_batch(self, batch):
        loop = self.main_loop
        if loop.status.iterations_done == 7:
            rows = [row for row in expected_rows(loop) if row["iteration"] < 7]
            with open({expected!r}, "w") as f:
                json.dump(rows, f)
            os._exit(3)

small_loop([Records(), JSONLinesLog({jsonl!r}), CSVLog({csv!r}), Kill(priority=5000),
            FinishAfter(after_n_epochs=5)]).run()
"""


def test_a_killed_run_leaves_every_completed_row_readable(tmp_path):
    paths = {JSONLinesLog: str(tmp_path / "log.jsonl"), CSVLog: str(tmp_path / "log.csv")}
    expected = str(tmp_path / "expected.json")
    script = KILLED_RUN.format(
        here=HERE,
        tests=os.path.dirname(HERE),
        root=ROOT,
        jsonl=paths[JSONLinesLog],
        csv=paths[CSVLog],
        expected=expected,
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert result.returncode == 3, result.stderr
    with open(expected) as f:
        rows = json.load(f)
    assert [row["iteration"] for row in rows] == [1, 2, 3, 4, 5, 6]
    for writer, path in paths.items():
        assert comparable(read_log(path)) == comparable(rows)
        # A write torn by the crash is ignored, and cut off when the next run appends.
        with open(path, "a") as f:
            f.write('{"iteration": 7, "lo' if writer is JSONLinesLog else "1,7,1,0.1")
        assert comparable(read_log(path)) == comparable(rows)
        small_loop([writer(path), FinishAfter(after_n_batches=1)]).run()
        every = read_log(path, all_runs=True)
        assert [(row["run"], row["iteration"]) for row in every] == [
            (1, i) for i in range(1, 7)
        ] + [(2, 1)]


def test_rows_up_to_an_error_are_written(tmp_path):
    class Boom(Extension):
        def after_batch(self, batch):
            if self.main_loop.status.iterations_done == 3:
                raise RuntimeError("kaboom")

    path = tmp_path / "log.jsonl"
    loop = small_loop([Records(), Boom(), JSONLinesLog(path), FinishAfter(after_n_epochs=1)])
    with pytest.raises(RuntimeError):
        loop.run()
    rows = read_log(path)
    assert [row["iteration"] for row in rows] == [1, 2, 3]
    assert "kaboom" in rows[-1]["error"] and rows[-1]["loss"] == 1 / 3


def test_fsync_forces_each_row_to_disk(tmp_path, monkeypatch):
    synced = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(fd) or real(fd))
    small_loop(
        [Records(), JSONLinesLog(tmp_path / "log.jsonl", fsync=True), FinishAfter(after_n_epochs=1)]
    ).run()
    assert len(synced) >= 1 + 4  # the run header and each of the four rows


def test_a_reserved_record_name_is_refused(tmp_path):
    loop = small_loop(
        [Script("run", [1.0]), JSONLinesLog(tmp_path / "log.jsonl"), FinishAfter(after_n_epochs=1)]
    )
    with pytest.raises(ValueError, match="'run' is reserved"):
        loop.run()


@pytest.mark.parametrize(
    "content, message",
    [
        (None, "no such log file"),
        ("", "empty"),
        ("hello\n", "not a log file"),
        ('{"iteration": 1}\n', "not a log file"),
        ("a,b\n1,2\n", "not a log file"),
        ('{"run": 1}\nnot json\n{"iteration": 2}\n', "line 2: not JSON"),
    ],
)
def test_reading_a_file_that_is_not_a_log_says_so(tmp_path, content, message):
    path = tmp_path / "some.log"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ValueError, match=message) as info:
        read_log(path)
    assert str(path) in str(info.value)


def test_a_writer_refuses_a_file_of_the_other_format(tmp_path):
    path = tmp_path / "log"
    small_loop([CSVLog(path), FinishAfter(after_n_batches=1)]).run()
    with pytest.raises(ValueError, match="is a csv log, not JSON lines"):
        small_loop([JSONLinesLog(path), FinishAfter(after_n_batches=1)]).run()


LOG_ON_SMALL_DISK = r"""
import json, sys
sys.path[:0] = [{tests!r}]
from scripted import small_loop
from mxoid import FinishAfter, TrainingMonitoring, {writer}
loop = small_loop(
    [FinishAfter(after_n_epochs=100), TrainingMonitoring("acc", every_n_batches=1),
     {writer}(sys.argv[1])]
)
try:
    loop.run()
    print("RESULT " + json.dumps(None))
except OSError as error:
    print("RESULT " + json.dumps([str(error), error.filename, "error" in loop.log.record_names()]))
"""


@pytest.mark.parametrize("writer", ["JSONLinesLog", "CSVLog"])
def test_a_full_disk_under_the_log_file_names_the_file_and_the_fix(tmp_path, writer):
    """The log file on a 64 KiB tmpfs of its own (a mount namespace that ends with the
    process), filled but for one page."""
    mount = tmp_path / "disk"
    script = tmp_path / "fill.py"
    script.write_text(LOG_ON_SMALL_DISK.format(tests=os.path.dirname(HERE), writer=writer))
    shell = f"head -c 61440 /dev/zero > {mount}/filler && {sys.executable} {script} {mount}/log"
    done = on_small_disk(mount, "size=64k", shell, timeout=300)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, done.stderr[-3000:]
    message, filename, recorded = json.loads(lines[0][7:])
    assert filename == f"{mount}/log"
    assert f"cannot write the log file {mount}/log" in message
    assert "No space left on device" in message and "free disk space" in message
    assert recorded  # the error is in the loop's log, as any training error
