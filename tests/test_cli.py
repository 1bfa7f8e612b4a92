"""The ``mxoid`` command: ``show`` and ``plot`` on real logs, and every bad input."""

import json
import struct
import subprocess
import sys
from pathlib import Path

import mxnet as mx
import pytest
from conftest import classification_data, full_environment, mlp

from mxoid import (
    Checkpoint,
    CSVLog,
    Evaluate,
    FinishAfter,
    JSONLinesLog,
    MainLoop,
    TrainingMonitoring,
)
from mxoid.cli import PLOT_EXTRA, epoch_positions, main, metric_families
from mxoid.log.files import read_log

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def digits_log(tmp_path_factory):
    """The JSON-lines log of a real run of the digits example (3 epochs of the MLP)."""
    folder = tmp_path_factory.mktemp("digits")
    env = full_environment(OMP_NUM_THREADS="1", MXNET_SUBGRAPH_VERBOSE="0")  # the digits
    subprocess.run(
        [
            sys.executable,
            str(EXAMPLES / "train_digits.py"),
            "--network",
            "mlp",
            "--epochs",
            "3",
            "--output-dir",
            str(folder),
        ],
        cwd=folder,
        env=env,
        check=True,
        capture_output=True,
        timeout=120,
    )
    return folder / "log.jsonl"


@pytest.fixture(scope="module")
def both_formats(tmp_path_factory):
    """The same run written by JSONLinesLog and CSVLog, with records every 5 batches."""
    folder = tmp_path_factory.mktemp("formats")
    X, y = classification_data(n=200)
    train = mx.io.NDArrayIter(X, y, batch_size=20, label_name="softmax_label")
    valid = mx.io.NDArrayIter(X[:60], y[:60], batch_size=20, label_name="softmax_label")
    MainLoop(
        mlp(),
        train,
        optimizer_params={"learning_rate": 0.1},
        extensions=[
            FinishAfter(after_n_epochs=2),
            TrainingMonitoring("acc", every_n_batches=5),
            Evaluate({"valid": valid}, "acc"),
            JSONLinesLog(folder / "log.jsonl"),
            CSVLog(folder / "log.csv"),
        ],
    ).run()
    return folder / "log.jsonl", folder / "log.csv"


def run_main(argv, capsys):
    status = main([str(arg) for arg in argv])
    out, err = capsys.readouterr()
    return status, out, err


def parse_table(text):
    lines = text.strip("\n").split("\n")
    return lines[0].split(), [line.split() for line in lines[1:]]


# -------------------------------------------------------------------- show
def test_show_a_row_per_epoch_with_every_numeric_record(digits_log, capsys):
    status, out, err = run_main(["show", digits_log], capsys)
    assert status == 0 and err == ""
    header, rows = parse_table(out)
    logged = [row for row in read_log(digits_log) if "valid_accuracy" in row]
    assert header[:2] == ["iteration", "epochs_done"]
    assert set(header[2:]) >= {
        "train_accuracy",
        "train_cross_entropy",
        "valid_accuracy",
        "valid_cross_entropy",
        "test_accuracy",
        "test_cross_entropy",
    }
    assert "checkpoint_saved_to" not in header and "training_finish_requested" not in header
    assert [int(row[1]) for row in rows] == [1, 2, 3]
    assert [int(row[0]) for row in rows] == [row["iteration"] for row in logged]
    column = header.index("test_accuracy")
    assert [float(row[column]) for row in rows] == pytest.approx(
        [row["test_accuracy"] for row in logged], rel=1e-5
    )


def test_show_chosen_records_by_name_pattern_and_commas(digits_log, capsys):
    status, out, _ = run_main(["show", digits_log, "--records", "test_accuracy,valid_*"], capsys)
    assert status == 0
    header, rows = parse_table(out)
    assert header == [
        "iteration",
        "epochs_done",
        "test_accuracy",
        "valid_accuracy",
        "valid_cross_entropy",
        "valid_accuracy_best_checkpoint",
    ]
    assert len(rows) == 3
    status, out, _ = run_main(
        ["show", digits_log, "--records", "training_finish_requested"], capsys
    )
    assert status == 0 and "FinishAfter: 3 epochs done" in out


def test_show_reads_csv_as_json_lines(both_formats, capsys):
    jsonl, csv_path = both_formats
    _, from_json, _ = run_main(["show", jsonl], capsys)
    _, from_csv, _ = run_main(["show", csv_path], capsys)
    assert from_json == from_csv
    header, rows = parse_table(from_json)
    assert header == ["iteration", "epochs_done", "train_accuracy", "valid_accuracy"]
    # Every 5 batches, 10 batches an epoch: rows 5, 10, 15, 20; '-' where a row lacks a record.
    assert [row[0] for row in rows] == ["5", "10", "15", "20"]
    assert [row[3] for row in rows] == ["-", rows[1][3], "-", rows[3][3]]


def test_show_all_runs(both_formats, tmp_path, capsys):
    appended = tmp_path / "two_runs.jsonl"
    text = both_formats[0].read_text()
    appended.write_text(text + text.replace('{"run": 1', '{"run": 2'))
    status, out, _ = run_main(["show", appended, "--all-runs"], capsys)
    assert status == 0
    header, rows = parse_table(out)
    assert header[0] == "run" and [row[0] for row in rows] == ["1"] * 4 + ["2"] * 4
    _, out, _ = run_main(["show", appended], capsys)
    assert len(parse_table(out)[1]) == 4  # the last run only


# -------------------------------------------------------------------- plot
def png_size(path):
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE, "not a PNG file"
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height, len(data)


def test_plot_writes_a_png_with_a_panel_per_family(digits_log, tmp_path, capsys):
    output = tmp_path / "curves.png"
    status, out, err = run_main(["plot", digits_log, "-o", output], capsys)
    assert status == 0 and err == ""
    # accuracy and cross_entropy (train, valid, test each); the best-checkpoint marker and
    # the timings are left out
    assert out.strip() == f"wrote {output}: 2 panel(s), 6 record(s)"
    width, height, size = png_size(output)
    # 2 panels of 4.8 x 3.4 inches at 100 dpi (matplotlib may round a pixel off)
    assert abs(width - 960) <= 2 and abs(height - 340) <= 2
    assert 20_000 < size < 2_000_000

    status, out, _ = run_main(
        [
            "plot",
            digits_log,
            "-o",
            tmp_path / "valid.png",
            "--records",
            "valid_accuracy",
            "--x",
            "iteration",
            "--dpi",
            "50",
        ],
        capsys,
    )
    assert status == 0 and "1 panel(s), 1 record(s)" in out
    width, height, _ = png_size(tmp_path / "valid.png")
    assert abs(width - 240) <= 2 and abs(height - 170) <= 2


def test_metric_families():
    families = metric_families(
        [
            "train_accuracy",
            "valid_accuracy",
            "test_accuracy",
            "valid_softmax_mse",
            "test_softmax_mse",
            "learning_rate",
            "time_epoch",
            "grad_norm_fc1",
            "grad_norm_fc2",
        ]
    )
    assert families == {
        "accuracy": [
            ("train", "train_accuracy"),
            ("valid", "valid_accuracy"),
            ("test", "test_accuracy"),
        ],
        "softmax_mse": [("valid", "valid_softmax_mse"), ("test", "test_softmax_mse")],
        "learning_rate": [("learning_rate", "learning_rate")],
        "time_epoch": [("time_epoch", "time_epoch")],
        "grad_norm_fc1": [("grad_norm_fc1", "grad_norm_fc1")],
        "grad_norm_fc2": [("grad_norm_fc2", "grad_norm_fc2")],
    }


def test_epoch_positions_between_epoch_ends():
    rows = [
        {"iteration": 5, "epochs_done": 0},
        {"iteration": 10, "epochs_done": 1},
        {"iteration": 15, "epochs_done": 1},
        {"iteration": 20, "epochs_done": 2},
        {"iteration": 25, "epochs_done": 2},
    ]
    assert epoch_positions(rows) == [0.5, 1.0, 1.5, 2.0, 2.5]
    # No epoch ended yet: the iteration stands in.
    assert epoch_positions(rows[:1]) == [5.0]


# --------------------------------------------------------------- bad input
def bad_inputs(tmp_path, digits_log):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    header_only = tmp_path / "header_only.jsonl"
    header_only.write_text(json.dumps({"run": 1, "started": "x", "start_iteration": 0}) + "\n")
    text = tmp_path / "notes.txt"
    text.write_text("some notes\nnot a log\n")
    binary = tmp_path / "weights.params"
    binary.write_bytes(bytes(range(256)) * 4)
    missing = tmp_path / "missing.jsonl"
    return [
        (["show", missing], f"{missing}: no such log file"),
        (["show", empty], f"{empty}: the log file is empty"),
        (["show", header_only], "holds no rows yet"),
        (["show", text], "not a log file written by JSONLinesLog or CSVLog"),
        (["show", binary], "not a log file written by JSONLinesLog or CSVLog"),
        (["show", tmp_path], "is a folder, not a log file"),
        (["show", digits_log, "--records", "valid_acc"], "unknown record 'valid_acc'; its records"),
        (["show", digits_log, "--records", "nope_*"], "no record matches 'nope_*'"),
        (["plot", missing, "-o", tmp_path / "x.png"], "no such log file"),
        (["plot", empty, "-o", tmp_path / "x.png"], "the log file is empty"),
        (["plot", text, "-o", tmp_path / "x.png"], "not a log file"),
        (
            ["plot", digits_log, "--records", "nope", "-o", tmp_path / "x.png"],
            "unknown record 'nope'",
        ),
        (
            ["plot", digits_log, "--records", "checkpoint_saved_to", "-o", tmp_path / "x.png"],
            "record 'checkpoint_saved_to' holds no numbers",
        ),
        (["plot", digits_log, "-o", tmp_path / "no" / "such" / "folder.png"], "cannot write"),
        (["plot", digits_log, "-o", tmp_path / "curves.xyz"], "cannot write"),
    ]


def test_every_bad_input_gives_one_line_and_status_1(digits_log, tmp_path, capsys):
    for argv, message in bad_inputs(tmp_path, digits_log):
        status, out, err = run_main(argv, capsys)
        assert status == 1, argv
        assert out == "", argv
        assert err.count("\n") == 1 and err.startswith(f"mxoid {argv[0]}: error: "), err
        assert message in err, (argv, err)
    assert not (tmp_path / "x.png").exists()


def test_plot_without_matplotlib_names_the_extra(digits_log, tmp_path, monkeypatch, capsys):
    for module in ("matplotlib", "matplotlib.figure", "matplotlib.backends.backend_agg"):
        monkeypatch.setitem(sys.modules, module, None)
    status, _, err = run_main(["plot", digits_log, "-o", tmp_path / "x.png"], capsys)
    assert status == 1
    assert err == f"mxoid plot: error: {PLOT_EXTRA}\n"
    assert "pip install 'mxoid[plot]'" in err


def test_bad_usage_gives_status_2(capsys):
    for argv in ([], ["show"], ["frobnicate"], ["plot", "log.jsonl", "--x", "time"]):
        with pytest.raises(SystemExit) as exit:
            main(argv)
        assert exit.value.code == 2
        assert "usage: mxoid" in capsys.readouterr().err


def test_launch_is_delegated_to_mxoid_launch(capsys):
    with pytest.raises(SystemExit) as exit:
        main(["launch", "--help"])
    assert exit.value.code == 0
    assert capsys.readouterr().out.startswith("usage: mxoid launch -n WORKERS")
    with pytest.raises(SystemExit) as exit:
        main(["launch", "-n", "2"])  # no command after '--'
    assert exit.value.code == 2 and "give the worker command" in capsys.readouterr().err


# ------------------------------------------------------------ entry points
def test_console_script_and_python_m(digits_log, tmp_path):
    script = Path(sys.executable).parent / "mxoid"
    assert script.is_file(), "the mxoid console script is not installed: pip install -e ."
    shown = subprocess.Popen(
        [str(script), "show", str(digits_log), "--records", "test_accuracy"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    failed = subprocess.Popen(
        [sys.executable, "-m", "mxoid", "show", str(tmp_path / "none.csv")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out, _ = shown.communicate(timeout=60)
    assert shown.returncode == 0 and out.split("\n")[0].split()[-1] == "test_accuracy"
    out, err = failed.communicate(timeout=60)
    assert failed.returncode == 1 and out == ""
    assert err == f"mxoid show: error: {tmp_path / 'none.csv'}: no such log file\n"


def drawn_figure(argv, monkeypatch, capsys):
    """Run mxoid plot and return the matplotlib figure it saved."""
    from matplotlib.figure import Figure

    saved = []
    monkeypatch.setattr(Figure, "savefig", lambda self, *a, **k: saved.append(self))
    status, out, err = run_main(["plot", *argv], capsys)
    assert status == 0, err
    return saved[0]


def test_plot_has_integer_epoch_ticks_a_title_naming_the_run_and_overlays_logs(
    digits_log, tmp_path, monkeypatch, capsys
):
    figure = drawn_figure([digits_log, "-o", tmp_path / "one.png"], monkeypatch, capsys)
    for axes in figure.axes:
        assert all(float(tick).is_integer() for tick in axes.get_xticks())
        assert axes.get_title() in ("accuracy", "cross_entropy")
    assert figure._suptitle.get_text().startswith("log.jsonl: run 1, started 20")
    other = tmp_path / "other.jsonl"
    other.write_text(digits_log.read_text())
    figure = drawn_figure([digits_log, other, "-o", tmp_path / "two.png"], monkeypatch, capsys)
    labels = [line.get_label() for line in figure.axes[0].get_lines()]
    assert "log: train" in labels and "other: train" in labels and len(labels) == 6
    assert " vs other.jsonl: run 1" in figure._suptitle.get_text()


def test_show_and_plot_a_resumed_run_as_one_run(tmp_path, monkeypatch, capsys):
    X, y = classification_data(n=200)

    def run(epochs, resume):
        train = mx.io.NDArrayIter(X, y, batch_size=20, label_name="softmax_label")
        valid = mx.io.NDArrayIter(X[:60], y[:60], batch_size=20, label_name="softmax_label")
        MainLoop(
            mlp(),
            train,
            optimizer_params={"learning_rate": 0.1},
            extensions=[
                FinishAfter(after_n_epochs=epochs),
                Evaluate({"valid": valid}, "acc"),
                Checkpoint(str(tmp_path / "ck")),
                JSONLinesLog(tmp_path / "log.jsonl"),
            ],
            resume_from=str(tmp_path / "ck") if resume else None,
        ).run()

    run(2, False)
    run(4, True)
    status, out, _ = run_main(["show", tmp_path / "log.jsonl"], capsys)
    header, rows = parse_table(out)
    assert status == 0 and [row[header.index("epochs_done")] for row in rows] == [
        "1",
        "2",
        "3",
        "4",
    ]
    figure = drawn_figure([tmp_path / "log.jsonl", "-o", tmp_path / "c.png"], monkeypatch, capsys)
    (line,) = figure.axes[0].get_lines()
    assert list(line.get_xdata()) == [1, 2, 3, 4]
    assert "run 2 (resumed 1x)" in figure._suptitle.get_text()
    status, out, _ = run_main(["show", tmp_path / "log.jsonl", "--all-runs"], capsys)
    header, rows = parse_table(out)
    # The runs as written, apart: the resumed run wrote the row it resumed at (epoch 2) again.
    assert [row[0] for row in rows] == ["1", "1", "2", "2", "2"]


def test_plot_gives_a_record_one_colour_in_every_panel(digits_log, tmp_path, monkeypatch, capsys):
    """``valid`` is the first line of the cross-entropy panel and the second of the accuracy
    panel: it keeps one colour (matplotlib's cycle restarted in each panel)."""
    records = "train_accuracy,valid_accuracy,valid_cross_entropy,test_cross_entropy"
    figure = drawn_figure(
        [digits_log, "-o", tmp_path / "c.png", "--records", records], monkeypatch, capsys
    )
    colours = {}
    for axes in figure.axes:
        for line in axes.get_lines():
            colours.setdefault(line.get_label(), set()).add(line.get_color())
    assert set(colours) == {"train", "valid", "test"}
    assert all(len(seen) == 1 for seen in colours.values()), colours
    assert len({seen.pop() for seen in colours.values()}) == 3
