"""Helpers of the checkpoint tests: a checkpointed loop, comparisons, the training script
in a subprocess, and editing checkpoint files behind the manifest's back."""

import hashlib
import json
import os
import select
import subprocess
import sys
import time

import mxnet as mx
import numpy as np
from conftest import TWO_CPUS, classification_data, initial_params, mlp
from scripted import small_loop

from mxoid import Checkpoint, FinishAfter, MainLoop, read_log
from mxoid.extensions import EarlyStopping, Evaluate, TrackBest, TrainingMonitoring

SCRIPT = os.path.join(os.path.dirname(__file__), "checkpoint", "scripts", "train_checkpointed.py")


def make_loop(
    directory,
    stop,
    *,
    optimizer="adam",
    resume=False,
    contexts=TWO_CPUS,
    iterator_factory=None,
    extra=(),
):
    X, y = classification_data(n=200)
    np.random.seed(5)
    if iterator_factory is None:
        train = mx.io.NDArrayIter(X, y, batch_size=20, shuffle=True, label_name="softmax_label")
    else:
        train = iterator_factory(X, y)
    net = mlp()
    params = (
        {"learning_rate": 0.01} if optimizer == "adam" else {"learning_rate": 0.1, "momentum": 0.9}
    )
    return MainLoop(
        net,
        train,
        contexts=contexts,
        optimizer=optimizer,
        optimizer_params=params,
        arg_params=initial_params(net, (20, 10)),
        extensions=[stop, Checkpoint(str(directory), every_n_batches=3), *extra],
        resume_from=str(directory) if resume else None,
    )


def leftovers(directory):
    """Hidden entries of a checkpoint directory but its lock file: half-written folders."""
    return [n for n in os.listdir(directory) if n.startswith(".") and n != ".mxoid-lock"]


def params_of(loop):
    return {k: v.asnumpy() for k, v in loop.get_params()[0].items()}


def assert_identical(a, b):
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def comparable_log(loop):
    """The log rows; checkpoint folders reduced to their epoch and batch.

    The folders differ between two runs' directories, and an interrupted run
    saves more checkpoints (so their sequence numbers differ).
    """
    rows = {}
    for iteration, row in loop.log.items():
        rows[iteration] = {
            k: (os.path.basename(v).split("-", 2)[2] if k == "checkpoint_saved_to" else v)
            for k, v in row.items()
        }
    return rows


def monitoring():
    """Stateful extensions whose records must come out the same after resumption."""
    X, y = classification_data(n=60, seed=7)
    valid = mx.io.NDArrayIter(X, y, batch_size=25, label_name="softmax_label")
    return [
        TrainingMonitoring(["acc", "ce"], every_n_batches=7),
        Evaluate({"valid": valid}, ["acc", "ce"]),
        TrackBest("valid_cross_entropy", mode="min"),
        EarlyStopping("valid_accuracy", patience=10, mode="max", min_delta=0.5),
    ]


# ---------------------------------------------------------------- processes
class Trainer:
    """The checkpointed training script in a subprocess, read line by line."""

    def __init__(self, directory, *args):
        env = dict(
            os.environ, OMP_NUM_THREADS="1", MXNET_SUBGRAPH_VERBOSE="0", PYTHONUNBUFFERED="1"
        )
        self.process = subprocess.Popen(
            [sys.executable, SCRIPT, str(directory), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            text=True,
        )
        self.lines = []

    def wait_for(self, prefix, timeout=60):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.process.stdout], [], [], 0.5)
            if ready:
                line = self.process.stdout.readline()
                if not line:
                    break
                self.lines.append(line)
                if line.startswith(prefix):
                    return line
        raise AssertionError(
            f"no line starting with {prefix!r}; got {self.lines[-5:]}; "
            f"stderr: {self.finish(5)[1][-2000:]}"
        )

    def finish(self, timeout=60):
        try:
            out, err = self.process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired as expired:
            self.process.kill()
            out, err = self.process.communicate()
            raise AssertionError(
                f"the training process did not exit within {timeout} s: {err}"
            ) from expired
        self.lines.extend(out.splitlines(True))
        return self.process.returncode, err


def rows_without(rows, *names):
    return [{k: v for k, v in row.items() if k not in names} for row in rows]


def comparable_file_rows(path):
    """The log file's rows: checkpoint folders reduced to their epoch and batch."""
    rows = []
    for row in read_log(path):
        row = {k: v for k, v in row.items() if k != "resumed_from"}
        if "checkpoint_saved_to" in row:
            row["checkpoint_saved_to"] = os.path.basename(row["checkpoint_saved_to"]).split("-", 2)[
                2
            ]
        rows.append(row)
    return rows


def rewrite(folder, name, data):
    """Replace a checkpoint file and update the manifest, so the hashes still match."""
    with open(os.path.join(folder, name), "wb") as handle:
        handle.write(data)
    manifest_path = os.path.join(folder, "MANIFEST.json")
    with open(manifest_path) as handle:
        manifest = json.load(handle)
    manifest["files"][name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    with open(manifest_path, "w") as handle:
        json.dump(manifest, handle)


def edit_manifest(folder, change):
    path = os.path.join(folder, "MANIFEST.json")
    with open(path) as handle:
        manifest = json.load(handle)
    change(manifest)
    with open(path, "w") as handle:
        json.dump(manifest, handle)


def best_keeping_loop(directory, epochs, resume=True):
    X, y = classification_data(n=60, seed=7)
    valid = mx.io.NDArrayIter(X, y, batch_size=20, label_name="softmax_label")
    return small_loop(
        [
            FinishAfter(after_n_epochs=epochs),
            Evaluate({"valid": valid}, "ce"),
            Checkpoint(str(directory), save_best_of="valid_cross_entropy"),
        ],
        resume_from=str(directory) if resume else None,
    )
