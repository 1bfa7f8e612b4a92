"""The example scripts run to completion, and the real-data ones learn.

Each example runs as a user runs it (a subprocess, from another folder),
with one OpenMP thread and a time limit. MNIST is read from the folder that
``MXOID_MNIST_DIR`` names (the four standard ``*-idx?-ubyte.gz`` files; nothing
is downloaded). Without it, the MNIST tests use ``../shared/data/mnist`` beside
the repository when it is there, and are skipped, saying how to point them at
the files, when it is not. A ``MXOID_MNIST_DIR`` that lacks files fails them.
"""

import csv
import os
import re
import runpy
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import full_environment

from mxoid.log.files import read_log

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
README = Path(__file__).resolve().parents[1] / "README.md"
MNIST_VARIABLE = "MXOID_MNIST_DIR"
BESIDE = Path(__file__).resolve().parents[2] / "shared" / "data" / "mnist"
MNIST_FILES = (
    "train-images-idx3-ubyte.gz",
    "train-labels-idx1-ubyte.gz",
    "t10k-images-idx3-ubyte.gz",
    "t10k-labels-idx1-ubyte.gz",
)
SCRIPTS = (
    "train_digits.py",
    "train_mnist.py",
    "multi_output.py",
    "custom_extension.py",
    "distributed.py",
    "fit.py",
    "own_loop.py",
    "train_gluon.py",
    "recipes.py",
)


def example_env():
    """As a user runs them: without MXNET_SUBGRAPH_VERBOSE, which the examples set themselves."""
    env = full_environment(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")  # the digits: sklearn
    env.pop("DMLC_ROLE", None)
    env.pop("MXNET_SUBGRAPH_VERBOSE", None)
    return env


def start(script, *args, cwd):
    return subprocess.Popen(
        [sys.executable, str(EXAMPLES / script), *map(str, args)],
        cwd=cwd,
        env=example_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(process, timeout, expect=0):
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        pytest.fail(f"{process.args} ran past {timeout} s\n{out[-3000:]}\n{err[-3000:]}")
    assert process.returncode == expect, (
        f"{process.args} exited with {process.returncode}\n{out[-3000:]}\n{err[-3000:]}"
    )
    return out, err


def run(script, *args, cwd, timeout=120, expect=0):
    return finish(start(script, *args, cwd=cwd), timeout, expect)


def run_in_process(script, *args, monkeypatch):
    """Run an example in this process (MXNet is imported already), as ``python SCRIPT ARGS``
    would; return the SystemExit it ends with (its code is what Python prints and exits with)."""
    monkeypatch.syspath_prepend(str(EXAMPLES))
    monkeypatch.setattr(sys, "argv", [script, *map(str, args)])
    with pytest.raises(SystemExit) as exit:
        runpy.run_path(str(EXAMPLES / script), run_name="__main__")
    return exit.value


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_example_has_help(script, monkeypatch, capsys):
    assert run_in_process(script, "--help", monkeypatch=monkeypatch).code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage:") and "--contexts" in out and "--epochs" in out
    flat = " ".join(out.split())  # argparse wraps the help
    assert "(default: None)" not in flat and not re.search(r"\(default: [^)]*\) \(default:", flat)
    assert "(default: )" not in flat


def test_fit_help_shows_every_default_as_mxnets_fit_py_does(monkeypatch, capsys):
    """An option without help text still says its default (argparse alone prints none)."""
    run_in_process("fit.py", "--help", monkeypatch=monkeypatch)
    flat = " ".join(capsys.readouterr().out.split())
    # "--lr LR, --learning-rate LR" up to Python 3.12, "--lr, --learning-rate LR" from 3.13
    for option, default in [
        ("--network", "lenet"),
        ("--batch-size", "64"),
        ("--lr", "0.1"),
        ("--optimizer", "sgd"),
        ("--num-epochs", "5"),
        ("--seed", "0"),
    ]:
        shown = rf"{option}[ ,][-A-Z_{{}},a-z ]*?\(default: {re.escape(default)}\)"
        assert re.search(shown, flat), option


# ------------------------------------------------------------------ digits
def test_digits_defaults_reach_95_percent(tmp_path):
    out, err = run("train_digits.py", "--output-dir", tmp_path / "run", cwd=tmp_path)
    rows = read_log(tmp_path / "run" / "log.jsonl")
    test_accuracy = [row["test_accuracy"] for row in rows if "test_accuracy" in row]
    print(
        f"digits defaults: test accuracy {test_accuracy[-1]:.4f} after {len(test_accuracy)} epochs"
    )
    assert test_accuracy[-1] >= 0.95
    assert f"test accuracy {test_accuracy[-1]:.4f}" in out
    # Printing reported every epoch, in a line under 100 characters with the epoch's own
    # seconds (they add up to no more than the total on the last line); the run stopped
    # early or at the limit.
    epoch_lines = [line for line in out.splitlines() if re.match(r"Epoch \d+/30 · ", line)]
    assert len(epoch_lines) == len(test_accuracy)
    assert all(len(line) < 100 for line in epoch_lines), epoch_lines
    # Four significant digits: 0.9877, or 1.000 once every training sample is right (as with
    # one OpenMP thread).
    assert all(
        re.match(r"Epoch \d+/30 · \d\.\d\d s · train_acc (0\.\d{4}|1\.000) · ", line)
        for line in epoch_lines
    )
    seconds = [float(line.split(" · ")[1].split()[0]) for line in epoch_lines]
    finished = next(line for line in out.splitlines() if line.startswith("Training finished"))
    assert sum(seconds) <= float(re.search(r"\((\d+\.\d+) s\)", finished).group(1)) + 0.01
    assert out.splitlines()[0].startswith("Training starts: ")
    assert "Traceback" not in err and "Subgraph backend" not in err + out  # examples keep quiet
    stop = [row["training_finish_requested"] for row in rows if "training_finish_requested" in row]
    assert stop and ("EarlyStopping" in stop[0] or "FinishAfter" in stop[0])
    folders = sorted(
        path.name for path in (tmp_path / "run" / "checkpoints").iterdir() if path.is_dir()
    )
    assert folders[0] == "best" and len(folders) == 3  # keep_last=2, and the best
    epochs = len(test_accuracy)
    assert folders[-1].startswith(f"checkpoint-{epochs:06d}-epoch{epochs:04d}")
    assert (tmp_path / "run" / "checkpoints" / "best" / "MANIFEST.json").is_file()


def test_digits_two_contexts_mlp_and_resume(tmp_path):
    output = tmp_path / "run"
    common = ("--contexts", "cpu:0,cpu:1", "--network", "mlp", "--output-dir", output)
    run("train_digits.py", "--epochs", 2, *common, cwd=tmp_path)
    run("train_digits.py", "--epochs", 3, "--resume", *common, cwd=tmp_path)
    rows = read_log(output / "log.jsonl", all_runs=True)
    evaluated = [(row["run"], row["epochs_done"]) for row in rows if "valid_accuracy" in row]
    # The second run went on from epoch 2 (and may repeat the row it resumed at).
    assert [epoch for run, epoch in evaluated if run == 1] == [1, 2]
    assert [epoch for run, epoch in evaluated if run == 2 and epoch != 2] == [3]
    assert rows[-1]["test_accuracy"] > 0.5


# ------------------------------------------------------------------- gluon
def test_gluon_example_trains_the_block_which_then_predicts_and_resumes(tmp_path):
    """A HybridSequential with BatchNorm and Dropout from a DataLoader with a random
    transform, read by two worker processes: the block, trained, predicts the test
    split as Evaluate measured it; a resumed run (the same loader rebuilt) continues;
    the checkpoints hold the files Gluon loads."""
    output = tmp_path / "run"
    common = ("--workers", 2, "--output-dir", output)
    out, err = run("train_gluon.py", "--epochs", 4, *common, cwd=tmp_path, timeout=300)
    found = re.search(r"test accuracy (\d\.\d+) \(Evaluate\), (\d\.\d+) \(net\(x\)", out)
    assert found and found.group(1) == found.group(2) and float(found.group(1)) >= 0.85, out
    assert "Traceback" not in err and "Subgraph backend" not in err + out
    newest = sorted((output / "checkpoints").glob("checkpoint-*"))[-1]
    assert {"net.params", "net-symbol.json", "model-0004.params"} <= {
        p.name for p in newest.iterdir()
    }
    run("train_gluon.py", "--epochs", 5, "--resume", *common, cwd=tmp_path, timeout=300)
    rows = read_log(output / "log.jsonl", all_runs=True)
    evaluated = [(row["run"], row["epochs_done"]) for row in rows if "valid_accuracy" in row]
    assert [epoch for run, epoch in evaluated if run == 2 and epoch != 4] == [5]


def test_recipes_prints_what_the_ema_and_the_checkpoint_average_add(tmp_path):
    """Warmup + cosine, an EMA and the best 3 checkpoints averaged: the three test
    accuracies printed (the EMA's as its Evaluate logged it), and the averaged model,
    the mean of the checkpoints it names, loads in Module.load."""
    import mxnet as mx

    output = tmp_path / "run"
    out, err = run("recipes.py", "--epochs", 6, "--output-dir", output, cwd=tmp_path)
    assert "Traceback" not in err and "Subgraph backend" not in err + out
    found = {
        label: float(value)
        for label, value in re.findall(
            r"^  (final parameters|EMA \(decay 0\.99\)|average of best 3) +(\d\.\d{4})",
            out,
            re.M,
        )
    }
    assert len(found) == 3 and all(value > 0.8 for value in found.values()), out
    rows = read_log(output / "log.jsonl")
    assert f"{rows[-1]['ema_test_accuracy']:.4f}" == f"{found['EMA (decay 0.99)']:.4f}"
    assert f"{rows[-1]['test_accuracy']:.4f}" == f"{found['final parameters']:.4f}"
    # The learning rate rose over the first epoch's 40 steps, then fell to near 0.
    rates = [row["learning_rate"] for row in rows if "learning_rate" in row]
    assert rates and max(rates) == pytest.approx(0.1, rel=0.05) and rates[-1] < 0.01
    chosen = re.search(r"^averaged: (.+)$", out, re.M).group(1).split(", ")
    assert len(chosen) == 3
    module = mx.mod.Module.load(str(output / "averaged"), 0)
    module.bind(
        data_shapes=[("data", (1, 1, 8, 8))],
        label_shapes=[("softmax_label", (1,))],
        for_training=False,
    )
    arg_params, _ = module.get_params()
    checkpoints = [
        mx.nd.load(str(next((output / "checkpoints" / folder).glob("model-*.params"))))
        for folder in chosen
    ]
    assert set(arg_params) == {name[4:] for name in checkpoints[0] if name.startswith("arg:")}
    for name, value in arg_params.items():
        mean = np.mean([c[f"arg:{name}"].asnumpy() for c in checkpoints], axis=0)
        np.testing.assert_allclose(value.asnumpy(), mean, rtol=1e-6, atol=1e-7)


def test_digits_needs_the_examples_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "sklearn", None)  # as on a machine without the extra
    monkeypatch.setitem(sys.modules, "sklearn.datasets", None)
    exit = run_in_process("train_digits.py", "--output-dir", tmp_path, monkeypatch=monkeypatch)
    # A string code: Python prints it to standard error and exits with status 1.
    assert isinstance(exit.code, str) and exit.code.startswith("error: ")
    assert "pip install 'mxoid[examples]'" in exit.code


# ------------------------------------------------------------------- MNIST
def mnist_dir():
    given = os.environ.get(MNIST_VARIABLE)
    folder = Path(given) if given else BESIDE
    missing = [name for name in MNIST_FILES if not (folder / name).is_file()]
    if missing and given:
        pytest.fail(f"{MNIST_VARIABLE}={given} lacks the MNIST files {missing}")
    if missing:
        pytest.skip(
            f"the MNIST tests need the four MNIST files ({', '.join(MNIST_FILES)}): set "
            f"{MNIST_VARIABLE} to the folder holding them"
        )
    return folder


@pytest.fixture(scope="module")
def mnist_runs(tmp_path_factory):
    """Both one-epoch MNIST runs, started together: each uses about one core."""
    data = mnist_dir()
    folder = tmp_path_factory.mktemp("mnist")
    runs = {}
    for name, contexts in (("one", "cpu:0"), ("two", "cpu:0,cpu:1")):
        output = folder / name
        runs[name] = (
            start(
                "train_mnist.py",
                "--data-dir",
                data,
                "--contexts",
                contexts,
                "--output-dir",
                output,
                cwd=folder,
            ),
            output,
        )
    yield runs
    for process, _ in runs.values():
        if process.poll() is None:
            process.kill()
            process.communicate()


@pytest.mark.parametrize("contexts", ["one", "two"])
def test_mnist_one_epoch_reaches_97_percent(mnist_runs, contexts):
    process, output = mnist_runs[contexts]
    out, _ = finish(process, timeout=400)
    rows = read_log(output / "log.jsonl")
    accuracy = rows[-1]["test_accuracy"]
    print(
        f"MNIST LeNet, 1 epoch, {contexts} context(s): test accuracy {accuracy:.4f}, "
        f"{rows[-1]['time_epoch']:.1f} s"
    )
    assert rows[-1]["epochs_done"] == 1
    assert accuracy >= 0.97
    assert f"on {1 if contexts == 'one' else 2} context(s)" in out


def test_mnist_mlp(tmp_path):
    # --network mlp, with large batches to keep it short.
    data = tmp_path / "data"
    data.mkdir()
    for name in MNIST_FILES:
        os.symlink(mnist_dir() / name, data / name)
    run(
        "train_mnist.py",
        "--data-dir",
        data,
        "--network",
        "mlp",
        "--epochs",
        1,
        "--batch-size",
        1024,
        "--output-dir",
        tmp_path / "run",
        cwd=tmp_path,
    )
    rows = read_log(tmp_path / "run" / "log.jsonl")
    assert rows[-1]["test_accuracy"] > 0.85


def test_mnist_says_which_files_are_missing(tmp_path, monkeypatch, capsys):
    exit = run_in_process(
        "train_mnist.py", "--data-dir", tmp_path / "nowhere", monkeypatch=monkeypatch
    )
    assert isinstance(exit.code, str) and exit.code.startswith("error: --data-dir must be")
    assert "nowhere does not exist" in exit.code and "train-images-idx3-ubyte.gz" in exit.code
    partial = tmp_path / "partial"
    partial.mkdir()
    for name in MNIST_FILES[:3]:
        os.symlink(mnist_dir() / name, partial / name)
    exit = run_in_process("train_mnist.py", "--data-dir", partial, monkeypatch=monkeypatch)
    assert f"{partial} lacks t10k-labels-idx1-ubyte.gz" in exit.code
    exit = run_in_process("train_mnist.py", monkeypatch=monkeypatch)
    assert exit.code == 2 and "--data-dir" in capsys.readouterr().err


# ------------------------------------------------------ the other examples
def test_multi_output(tmp_path):
    out, _ = run(
        "multi_output.py",
        "--epochs",
        3,
        "--contexts",
        "cpu:0,cpu:1",
        "--output-dir",
        tmp_path / "run",
        cwd=tmp_path,
    )
    rows = read_log(tmp_path / "run" / "log.jsonl")
    last = rows[-1]
    for prefix in ("train", "valid", "test"):
        assert last[f"{prefix}_softmax_accuracy"] > 0.5
        assert 0 <= last[f"{prefix}_intensity_mae"] < 0.1
        assert last[f"{prefix}_intensity_mse"] <= last[f"{prefix}_intensity_mae"]
        assert f"{prefix}_softmax_cross_entropy" in last
    assert [row["epochs_done"] for row in rows if "valid_softmax_accuracy" in row] == [1, 2, 3]
    assert "intensity_mae" in out


def test_custom_extension(tmp_path):
    out, _ = run(
        "custom_extension.py",
        "--epochs",
        2,
        "--every",
        8,
        "--contexts",
        "cpu:0,cpu:1",
        "--output-dir",
        tmp_path / "run",
        cwd=tmp_path,
    )
    with open(tmp_path / "run" / "grad_norms.csv", newline="") as f:
        lines = list(csv.reader(f))
    assert lines[0] == ["iteration", "epoch", "fc1_weight", "fc1_bias", "fc2_weight", "fc2_bias"]
    iterations = [int(line[0]) for line in lines[1:]]
    assert iterations == list(range(8, 80 + 1, 8))  # 40 batches per epoch, 2 epochs
    rows = {row["iteration"]: row for row in read_log(tmp_path / "run" / "log.jsonl")}
    for line in lines[1:]:
        row = rows[int(line[0])]
        assert float(line[2]) == pytest.approx(row["grad_norm_fc1_weight"], rel=1e-5)
        assert all(float(value) > 0 for value in line[2:])
    assert "newest gradient norms: fc1_weight" in out


# ------------------------------------------------------------------ fit.py
def params_file(path):
    import mxnet as mx

    return {name: value.asnumpy() for name, value in mx.nd.load(str(path)).items()}


def assert_same_params(a, b):
    assert sorted(a) == sorted(b)
    for name in a:
        assert (a[name] == b[name]).all(), name


@pytest.fixture(scope="module")
def fit_straight(tmp_path_factory):
    """fit.py for 3 epochs with a rate step at epoch 2: the run the others are measured on."""
    folder = tmp_path_factory.mktemp("fit")
    out, _ = run("fit.py", *FIT, "--num-epochs", 3, "--model-prefix", "straight/m", cwd=folder)
    return folder, out


FIT = ("--lr-step-epochs", "2", "--disp-batches", 10, "--batch-size", 64)


def test_fit_saves_what_do_checkpoint_saves_and_learns(fit_straight):
    folder, out = fit_straight
    saved = sorted(path.name for path in (folder / "straight").iterdir())
    assert saved == [
        "m-0001.params",
        "m-0002.params",
        "m-0003.params",
        "m-checkpoints",
        "m-log.jsonl",
        "m-symbol.json",
    ]
    rows = read_log(folder / "straight" / "m-log.jsonl")
    assert rows[-1]["valid_accuracy"] >= 0.9
    assert f"valid accuracy {rows[-1]['valid_accuracy']:.4f} after 3 epochs" in out
    # --disp-batches 10: a line every 10 batches (20 batches per epoch).
    assert re.search(r"^Batch 10/20 · epoch 1/3 · ", out, re.M) and "Batch 10/20 · epoch 2/3" in out
    # The rate steps down by --lr-factor after epoch 2, as fit.py's MultiFactorScheduler
    # does: set before batch 1 (row 0), then before batch 41 (row 40).
    rates = {row["iteration"]: row["learning_rate"] for row in rows if "learning_rate" in row}
    assert rates == {0: pytest.approx(0.1), 40: pytest.approx(0.01)}


def test_fit_load_epoch_resumes_exactly(fit_straight):
    folder, _ = fit_straight
    run("fit.py", *FIT, "--num-epochs", 2, "--model-prefix", "resumed/m", cwd=folder)
    out, _ = run(
        "fit.py",
        *FIT,
        "--num-epochs",
        3,
        "--model-prefix",
        "resumed/m",
        "--load-epoch",
        2,
        cwd=folder,
    )
    assert "after 3 epochs" in out
    assert_same_params(
        params_file(folder / "resumed" / "m-0003.params"),
        params_file(folder / "straight" / "m-0003.params"),
    )


def test_fit_load_epoch_from_module_files_only(fit_straight):
    """Only prefix-symbol.json and prefix-0002.params (what Module.fit leaves): the run
    starts from those parameters at epoch 2, with the rate of epoch 2, as fit.py does."""
    folder, _ = fit_straight
    module_only = folder / "module_only"
    module_only.mkdir()
    for name in ("m-symbol.json", "m-0002.params"):
        shutil.copy(folder / "straight" / name, module_only / name)
    out, _ = run(
        "fit.py",
        *FIT,
        "--num-epochs",
        3,
        "--model-prefix",
        "module_only/m",
        "--load-epoch",
        2,
        cwd=folder,
    )
    rows = read_log(module_only / "m-log.jsonl")
    assert [row["epochs_done"] for row in rows if "valid_accuracy" in row] == [1]
    assert "Adjust learning rate to 1.000000e-02 for epoch 2" in out
    assert rows[-1]["valid_accuracy"] >= 0.9  # one epoch from scratch gets about 0.8
    assert "after 3 epochs" in out
    assert (module_only / "m-0001.params").is_file()  # numbered from the epochs it ran


def test_fit_pretrained_new_head_and_fixed_param_names(fit_straight):
    folder, _ = fit_straight
    frozen = ["conv1_weight", "conv1_bias", "conv2_weight"]
    out, _ = run(
        "fit.py",
        *FIT,
        "--num-epochs",
        1,
        "--num-classes",
        12,
        "--model-prefix",
        "tuned/m",
        "--pretrained",
        "straight/m",
        "--pretrained-epoch",
        3,
        "--fixed-param-names",
        ",".join(frozen),
        cwd=folder,
    )
    assert "pretrained ['fc2_bias', 'fc2_weight'] have other shapes here" in out
    before = params_file(folder / "straight" / "m-0003.params")
    after = params_file(folder / "tuned" / "m-0001.params")
    for name in frozen:
        assert (after[f"arg:{name}"] == before[f"arg:{name}"]).all(), name
    for name in ("conv2_bias", "fc1_weight"):  # loaded, then trained
        assert not (after[f"arg:{name}"] == before[f"arg:{name}"]).all(), name
    assert after["arg:fc2_weight"].shape == (12, 64)


def test_fit_two_devices_gradient_compression_top_k_monitor(tmp_path):
    common = (
        "--num-epochs",
        1,
        "--contexts",
        "cpu:0,cpu:1",
        "--kv-store",
        "device",
        "--top-k",
        3,
        "--loss",
        "ce",
        "--monitor",
        10,
        "--accumulate-batches",
        2,
        "--max-grad-norm",
        5,
    )
    run("fit.py", *common, "--model-prefix", "plain/m", cwd=tmp_path)
    run("fit.py", *common, "--gc-type", "2bit", "--model-prefix", "2bit/m", cwd=tmp_path)
    rows = {row["iteration"]: row for row in read_log(tmp_path / "2bit" / "m-log.jsonl")}
    last = rows[max(rows)]
    assert {"valid_top_k_accuracy_3", "valid_cross_entropy", "train_accuracy"} <= set(last)
    assert last["valid_top_k_accuracy_3"] >= last["valid_accuracy"]
    monitored = sorted(i for i, row in rows.items() if "monitor_fc1_weight_rms" in row)
    assert monitored == [10, 20]
    # The compression is applied: the same run without it ends elsewhere.
    plain = params_file(tmp_path / "plain" / "m-0001.params")
    compressed = params_file(tmp_path / "2bit" / "m-0001.params")
    assert not (plain["arg:fc1_weight"] == compressed["arg:fc1_weight"]).all()


def test_distributed_digits_under_the_launcher(tmp_path):
    env = dict(example_env(), MXNET_CPU_WORKER_NTHREADS="1")
    launcher = [sys.executable, "-m", "mxoid", "launch", "-n", "2", "--timeout", "150", "--"]
    process = subprocess.run(
        launcher
        + [
            sys.executable,
            str(EXAMPLES / "distributed.py"),
            "--network",
            "mlp",
            "--epochs",
            "2",
            "--output-dir",
            str(tmp_path / "run"),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=200,
    )
    assert process.returncode == 0, process.stdout[-3000:] + process.stderr[-3000:]
    finals = sorted(
        line.split("] ", 1)[1] for line in process.stdout.splitlines() if "test accuracy" in line
    )
    # Both workers record the same accuracy: evaluation sums over the workers.
    assert len(finals) == 2 and finals[0].split(":")[1] == finals[1].split(":")[1], finals
    rows = read_log(tmp_path / "run" / "log.jsonl")  # written by rank 0 alone
    assert [row["epochs_done"] for row in rows if "test_accuracy" in row] == [1, 2]
    assert f"{rows[-1]['test_accuracy']:.4f}" in finals[0]
    # Printing ran on rank 0 only (the scheduler gives ranks: not the launch order).
    lines = process.stdout.splitlines()
    rank_zero = next(line.split("] ")[0] for line in lines if "worker 0 of 2" in line)
    printed = {line.split("] ")[0] for line in lines if re.search(r"\] Epoch \d+/2 · ", line)}
    assert printed == {rank_zero}


def test_distributed_example_refuses_to_run_alone(monkeypatch, capsys):
    monkeypatch.delenv("DMLC_ROLE", raising=False)
    assert run_in_process("distributed.py", monkeypatch=monkeypatch).code == 2
    err = capsys.readouterr().err
    assert "mxoid launch -n 2 -- python" in err and "distributed.py" in err


# ------------------------------------------------------------------ README
def readme_python(section):
    """The Python code blocks of a section of the README."""
    text = README.read_text()
    start = text.index(f"\n## {section}")
    end = text.find("\n## ", start + 1)
    return re.findall(r"```python\n(.*?)```", text[start : end if end > 0 else None], re.S)


LAUNCHED = {"Distributed training"}  # a script for mxoid launch: run so, twice, below


def readme_python_in_order():
    """Every ```python block of the README, with its section's title, in the README's order."""
    sections = re.split(r"\n(?=## )", README.read_text())
    return [
        (section.splitlines()[0][3:], block)
        for section in sections
        for block in re.findall(r"```python\n(.*?)```", section, re.S)
    ]


def test_every_python_block_of_the_readme_runs_as_pasted_twice(tmp_path, monkeypatch):
    """As a reader pastes them into one session, in a fresh folder: each block with only what
    the blocks before it defined; then all of them again, as a second run of the same script
    in the same folder (checkpoint directories and logs of the first run are there)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MXNET_SUBGRAPH_VERBOSE", raising=False)
    blocks = readme_python_in_order()
    assert len(blocks) >= 12 and "<!--" not in README.read_text()  # no internal notes
    for run in (1, 2):
        namespace = {"__name__": "__main__"}
        for title, block in blocks:
            if title in LAUNCHED:
                continue
            try:
                exec(compile(block, f"README.md, {title}", "exec"), namespace)
            except Exception as error:  # say which block, then fail
                message = f"run {run}: the block of {title!r} raised {error!r}"
                raise AssertionError(message) from error


def test_readme_quick_start_and_extensions_run(tmp_path, monkeypatch, capsys):
    from mxoid import Evaluate, FinishAfter, MainLoop

    monkeypatch.chdir(tmp_path)
    namespace = {}
    blocks = (
        readme_python("Quick start")
        + readme_python("Using the trained model")
        + readme_python("Writing an extension")
    )
    assert len(blocks) == 7
    for block in blocks[:2]:
        exec(compile(block, str(README), "exec"), namespace)
    assert namespace["loop"].log.last("valid_accuracy") > 0.8
    # The model loaded from the newest checkpoint predicts what Evaluate recorded.
    accuracy = (namespace["probabilities"].argmax(axis=1) == namespace["y"][1500:]).mean()
    assert accuracy == pytest.approx(namespace["loop"].log.last("valid_accuracy"), abs=1e-9)
    assert f"{accuracy}" in capsys.readouterr().out
    check_readme_ways_out(namespace, blocks[2:4], accuracy, capsys)
    blocks = blocks[:2] + blocks[4:]
    quick_start_predictions = namespace["loop"].predict(valid := namespace["valid"])["softmax"]
    check_readme_fine_tuning(namespace, quick_start_predictions, capsys)
    (block,) = readme_python("Reading input ahead")
    exec(compile(block, str(README), "exec"), namespace)
    assert namespace["ahead"].status.epochs_done == 2
    assert any((tmp_path / "prefetched-checkpoints").iterdir())
    for block in blocks[2:]:
        exec(compile(block, str(README), "exec"), namespace)
    assert (tmp_path / "log.jsonl").is_file() and any((tmp_path / "checkpoints").iterdir())
    # The two extensions of "Writing an extension" in a loop.
    train = namespace["train"]
    train.reset()
    loop = MainLoop(
        namespace["net"],
        train,
        extensions=[
            FinishAfter(after_n_epochs=5),
            Evaluate({"valid": valid}, "ce"),
            namespace["LearningRateRecord"](),
            namespace["StopBelow"]("valid_cross_entropy", 10.0),
        ],
    )
    loop.run()
    assert loop.status.epochs_done == 1
    assert loop.log.last("training_finish_requested") == "valid_cross_entropy fell below 10.0"
    assert loop.log.last("lr") == pytest.approx(0.01)
    assert namespace["stopper"].conditions.keys() == {"after_epoch", "after_batch"}
    # TrackBest plus a condition keeps the best model.
    train.reset()
    best, keeper = namespace["best"], namespace["keeper"]
    loop = MainLoop(
        namespace["net"],
        train,
        optimizer_params={"learning_rate": 0.05, "momentum": 0.9},
        extensions=[FinishAfter(after_n_epochs=4), Evaluate({"valid": valid}, "acc"), best, keeper],
    ).run()
    accuracies = [row["valid_accuracy"] for _, row in loop.log.items() if "valid_accuracy" in row]
    assert best.best.value == max(accuracies)
    assert best.best.iteration == loop.log.last_iteration("valid_accuracy_new_best")
    assert keeper.best_params[0].keys() == loop.get_params()[0].keys()


def check_readme_ways_out(namespace, blocks, accuracy, capsys):
    """The ONNX file predicts what Evaluate recorded; the int8 model within 2% of it."""
    onnx_block, int8_block = blocks
    exec(compile(onnx_block, str(README), "exec"), namespace)
    exported = namespace["exported"]
    assert exported.inputs == {"data": ("batch", 64)} and exported.outputs == ["softmax"]
    assert exported.max_difference < 1e-6  # "below 1e-6"
    onnx_accuracy = (namespace["onnx_probabilities"].argmax(axis=1) == namespace["y"][1500:]).mean()
    assert onnx_accuracy == pytest.approx(accuracy, abs=1e-9)
    printed = capsys.readouterr().out
    assert "{'data': ('batch', 64)} ['softmax']" in printed and f"{onnx_accuracy}" in printed
    exec(compile(int8_block, str(README), "exec"), namespace)
    int8 = namespace["int8"]
    int8_accuracy = (namespace["int8_probabilities"].argmax(axis=1) == namespace["y"][1500:]).mean()
    assert int8.quantized_layers >= 2 and abs(int8_accuracy - accuracy) <= 0.02
    assert f"{int8.quantized_layers} {int8_accuracy}" in capsys.readouterr().out


def test_the_quick_start_runs_twice_as_a_script_and_keeps_mxnet_quiet(tmp_path):
    """As a newcomer pastes it into a file and runs it, twice, without MXNET_SUBGRAPH_VERBOSE."""
    (block,) = readme_python("Quick start")
    script = tmp_path / "quick_start.py"
    script.write_text(block)
    for run in (1, 2):
        done = subprocess.run(
            [sys.executable, str(script)],
            cwd=tmp_path,
            env=example_env(),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert "Subgraph backend" not in done.stdout + done.stderr
        lines = done.stdout.splitlines()
        epochs = [line for line in lines if line.startswith("Epoch ")]
        shape = r"Epoch \d+/20 · \d\.\d\d s · train_acc "
        assert epochs and all(re.match(shape, line) for line in epochs)
        assert all(len(line) < 100 for line in epochs)
        assert re.match(r"Training finished after \d+ epochs? .*\(\d+\.\d+ s\)", lines[-2])
        saved = [path for path in (tmp_path / "checkpoints").iterdir() if path.is_dir()]
        # Each run's checkpoints: the second run's beside the first's.
        assert len({path.name.split("-")[1] for path in saved}) == len(saved) >= run * 2


def check_readme_fine_tuning(namespace, quick_start_predictions, capsys):
    """Run "Fine-tuning, accumulation and inference" after the Quick start; check its claims."""
    from mxoid.checkpoint import latest_checkpoint

    (block,) = readme_python("Fine-tuning, accumulation and inference")
    started = dict(namespace["loop"].get_params()[0])
    exec(compile(block, str(README), "exec"), namespace)
    tuned, valid, y = namespace["tuned"], namespace["valid"], namespace["y"]
    # The frozen layer kept the saved values; the new head was drawn anew and trained.
    saved_args = namespace["load_params"]("checkpoints")[0]
    final = tuned.get_params()[0]
    for name in ("fc1_weight", "fc1_bias"):
        assert (final[name].asnumpy() == saved_args[name].asnumpy()).all()
        assert (final[name].asnumpy() == started[name].asnumpy()).all()
    assert not np.allclose(final["fc2_weight"].asnumpy(), saved_args["fc2_weight"].asnumpy())
    assert (tuned.status.iterations_done, tuned.status.updates_done) == (94, 47)
    assert "94 47" in capsys.readouterr().out
    log = dict(tuned.log.items())
    # Every 10th step (a step every 2 batches), every 20th batch.
    assert sorted(i for i, row in log.items() if "gradient_norm" in row) == [20, 40, 60, 80]
    assert sorted(i for i, row in log.items() if "monitor_fc2_weight_rms" in row) == [
        20,
        40,
        60,
        80,
    ]
    # predict: one row per sample; score: what the predictions give.
    probabilities = namespace["probabilities"]
    assert probabilities.shape == (len(y) - 1500, 10)
    scores = tuned.score(valid, ["acc", "ce"])
    assert scores["valid_accuracy"] == pytest.approx((probabilities.argmax(1) == y[1500:]).mean())
    picked = probabilities[np.arange(len(probabilities)), y[1500:].astype(int)]
    assert scores["valid_cross_entropy"] == pytest.approx(-np.log(picked).mean(), rel=1e-5)
    # The Predictor of the Quick start's checkpoint predicts what its loop predicted.
    assert latest_checkpoint("checkpoints").loop_state["status"]["epochs_done"] == (
        namespace["loop"].status.epochs_done
    )
    np.testing.assert_allclose(namespace["saved"], quick_start_predictions, rtol=1e-5, atol=1e-7)


def test_a_fresh_clone_skips_the_mnist_tests_saying_how_to_run_them(tmp_path):
    root = Path(__file__).resolve().parents[1]
    clone = tmp_path / "elsewhere" / "mxoid"
    # What a clone of this working tree holds: the files git tracks or would track.
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    for name in listed:
        if (root / name).is_file():
            (clone / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(root / name, clone / name)
    env = {k: v for k, v in full_environment().items() if k != MNIST_VARIABLE}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-rs",
            "-p",
            "no:cacheprovider",
            "tests/test_examples.py",
            "-k",
            "mnist and not says_which and not fresh_clone",
        ],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:]
    assert "skipped" in done.stdout and f"set {MNIST_VARIABLE} to the folder" in done.stdout


@pytest.mark.parametrize("run", [1, 2])  # a second run in the same folder, as pasted twice
def test_readme_distributed_example_runs_under_the_launcher(tmp_path_factory, run):
    (block,) = readme_python("Distributed training")
    tmp_path = tmp_path_factory.getbasetemp() / "readme-distributed"
    tmp_path.mkdir(exist_ok=True)
    script = tmp_path / "train.py"
    script.write_text(block)
    env = dict(example_env(), MXNET_CPU_WORKER_NTHREADS="1")  # the script keeps MXNet quiet
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mxoid",
            "launch",
            "-n",
            "2",
            "-s",
            "1",
            "--timeout",
            "150",
            "--",
            sys.executable,
            str(script),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=200,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    finals = sorted(
        line.split("] ", 1)[1] for line in done.stdout.splitlines() if "valid accuracy" in line
    )
    assert [line.split(":")[0] for line in finals] == ["rank 0", "rank 1"]
    accuracies = {line.split()[-1] for line in finals}
    assert len(accuracies) == 1 and float(accuracies.pop()) > 0.85  # summed over the workers
    assert "Subgraph backend" not in done.stdout + done.stderr


# ------------------------------------------------------------------ a loop of one's own
@pytest.mark.parametrize("contexts", ["cpu:0", "cpu:0,cpu:1"])
def test_own_loop_trains_two_groups_with_two_optimizers(contexts, monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))
    import own_loop

    learned = own_loop.main(["--contexts", contexts, "--epochs", "6"])
    assert learned["valid_accuracy"] > 0.9
    # Each group follows its own optimizer: with the head's rate at 0 only the body moves.
    frozen_head = own_loop.main(["--contexts", contexts, "--epochs", "1", "--head-lr", "0"])
    initial, trained = frozen_head["initial"], frozen_head["trained"]
    for name in initial:
        same = np.array_equal(initial[name].asnumpy(), trained[name].asnumpy())
        assert same == (name in own_loop.HEAD), name
