"""Log files: a resumed run continues the run it resumed, in both formats."""

import json

import pytest

from mxoid.log.files import continued_rows, parse_log_file, read_log


def write_jsonl(path, runs):
    lines = []
    for number, (header, rows) in enumerate(runs, start=1):
        lines.append(json.dumps({"run": number, "started": "now", **header}))
        lines += [
            json.dumps({"iteration": i, "epochs_done": i // 4, **values}) for i, values in rows
        ]
    path.write_text("\n".join(lines) + "\n")


def write_csv(path, runs):
    lines = ["run,iteration,epochs_done,loss,resumed_from"]
    for number, (_, rows) in enumerate(runs, start=1):
        lines += [
            f"{number},{i},{i // 4},{values.get('loss', '')},{values.get('resumed_from', '')}"
            for i, values in rows
        ]
    path.write_text("\n".join(lines) + "\n")


# Run 1 trained to batch 9 and was killed; its last checkpoint was at batch 6, and it had
# not written row 5 (it writes a row once the next batch is done). Run 2 resumed at 6,
# first writing the missing row 5 at the end of run 1, then rows 6 on.
RUNS = [
    (
        {"start_iteration": 0},
        [(i, {"loss": 10.0 - i}) for i in (1, 2, 3, 4)]
        + [(i, {"loss": 99.0}) for i in (6, 7, 8)]
        + [(5, {"loss": 5.0})],
    ),
    (
        {"start_iteration": 6, "resumed_from": "ck"},
        [(6, {"loss": 4.0, "resumed_from": "ck"})] + [(i, {"loss": 10.0 - i}) for i in (7, 8, 9)],
    ),
]


@pytest.mark.parametrize("write", [write_jsonl, write_csv])
def test_a_resumed_run_reads_as_one_continued_run(tmp_path, write):
    path = tmp_path / "log"
    write(path, RUNS)
    rows = read_log(path)
    assert [row["iteration"] for row in rows] == [1, 2, 3, 4, 5, 6, 7, 8, 9]
    assert [row["loss"] for row in rows] == [9.0, 8.0, 7.0, 6.0, 5.0, 4.0, 3.0, 2.0, 1.0]
    assert len(read_log(path, all_runs=True)) == 12  # every row as written
    assert [row["run"] for row in continued_rows(parse_log_file(path), last=1)] == [1] * 8


def test_a_fresh_run_appended_is_a_training_of_its_own(tmp_path):
    path = tmp_path / "log.jsonl"
    write_jsonl(path, [RUNS[0], ({"start_iteration": 0}, [(1, {"loss": 1.0})])])
    assert [row["iteration"] for row in read_log(path)] == [1]
