"""The Checkpoint extension: what it keeps, the best state, records of any type, the run that
owns a directory, and saves that fail (a full or read-only disk, a file size limit, a file in
the way), with a clear error and nothing recorded."""

import json
import os
import resource
import sys

import mxnet as mx
import numpy as np
import pytest
from checkpointing import Trainer, best_keeping_loop, leftovers, make_loop
from conftest import classification_data, initial_params, mlp
from scripted import Script, small_loop
from small_disk import on_small_disk

from mxoid import Checkpoint, CheckpointError, Evaluate, Extension, FinishAfter, MainLoop
from mxoid.checkpoint import DirectoryLock, list_checkpoints, read_checkpoint


def test_keep_last_removes_older_checkpoints(tmp_path):
    make_loop(tmp_path, FinishAfter(after_n_epochs=2)).run()
    names = [os.path.basename(p) for p in list_checkpoints(str(tmp_path))]
    assert len(names) == 3
    assert names[-1].endswith("epoch0002-batch00000020")
    assert not leftovers(tmp_path)


class Explode(Extension):
    def after_batch(self, batch):
        if self.main_loop.status.iterations_done == 7:
            raise RuntimeError("extension bug")


def test_crash_leaves_the_last_checkpoint_intact(tmp_path):
    loop = make_loop(tmp_path, FinishAfter(after_n_epochs=2), extra=[Explode()])
    with pytest.raises(RuntimeError, match="extension bug"):
        loop.run()
    newest = list_checkpoints(str(tmp_path))[-1]
    assert newest.endswith("batch00000006")
    assert read_checkpoint(newest).loop_state["status"]["iterations_done"] == 6


def test_save_best_of_keeps_the_best_state_and_adds_no_empty_rows(tmp_path):
    X, y = classification_data(n=60, seed=7)
    valid = mx.io.NDArrayIter(X, y, batch_size=20, label_name="softmax_label")
    np.random.seed(5)
    X, y = classification_data(n=200)
    net = mlp()
    loop = MainLoop(
        net,
        mx.io.NDArrayIter(X, y, batch_size=20, shuffle=True, label_name="softmax_label"),
        optimizer_params={"learning_rate": 0.05},
        arg_params=initial_params(net, (20, 10)),
        extensions=[
            FinishAfter(after_n_epochs=5),
            Evaluate({"valid": valid}, "ce"),
            Checkpoint(str(tmp_path), every_n_batches=7, save_best_of="valid_cross_entropy"),
        ],
    ).run()
    assert all(row for _, row in loop.log.items())  # no row was created empty
    values = [
        row["valid_cross_entropy"] for _, row in loop.log.items() if "valid_cross_entropy" in row
    ]
    best = read_checkpoint(str(tmp_path / "best"))
    saved_rows = dict(best.loop_state["log"]["rows"])
    assert saved_rows[best.loop_state["status"]["iterations_done"]]["valid_cross_entropy"] == min(
        values
    )
    assert best.loop_state["status"]["epochs_done"] == 1 + values.index(min(values))


# ------------------------------------------------------------ 1. runs in a folder
def test_a_new_run_refuses_a_folder_holding_another_runs_checkpoints(tmp_path):
    make_loop(tmp_path, FinishAfter(after_n_epochs=1)).run()
    before = list_checkpoints(str(tmp_path))
    with pytest.raises(CheckpointError, match="already holds checkpoints of another run") as info:
        make_loop(tmp_path, FinishAfter(after_n_epochs=1)).run()
    assert "resume_from=" in str(info.value) and "require_empty=False" in str(info.value)
    assert list_checkpoints(str(tmp_path)) == before  # nothing pruned, nothing written


def test_a_new_run_beside_an_older_one_keeps_its_checkpoints_and_is_resumed(tmp_path):
    make_loop(tmp_path, FinishAfter(after_n_epochs=2)).run()  # keep_last=3, sequence up to 8
    older = list_checkpoints(str(tmp_path))
    X, y = classification_data(n=200)
    net = mlp()
    np.random.seed(5)
    train = mx.io.NDArrayIter(X, y, batch_size=20, shuffle=True, label_name="softmax_label")
    loop = MainLoop(
        net,
        train,
        arg_params=initial_params(net, (20, 10)),
        optimizer="adam",
        optimizer_params={"learning_rate": 0.01},
        extensions=[
            FinishAfter(after_n_batches=4),
            Checkpoint(str(tmp_path), every_n_batches=3, require_empty=False),
        ],
    )
    loop.run()
    now = list_checkpoints(str(tmp_path))
    assert now[: len(older)] == older  # the older run's checkpoints are untouched
    mine = now[len(older) :]
    assert len(mine) == 2 and all(os.path.isdir(p) for p in mine)  # batches 3 and 4, kept
    assert read_checkpoint(mine[-1]).run_id == loop.run_id != read_checkpoint(older[-1]).run_id
    resumed = make_loop(tmp_path, FinishAfter(after_n_batches=6), resume=True, contexts=[mx.cpu()])
    assert resumed.resumed_from == mine[-1] and resumed.run_id == loop.run_id


# ------------------------------------------------------------ 2. the best checkpoint
def test_save_best_of_after_resumption_never_replaces_the_best_with_a_worse_state(tmp_path):
    scores = [0.5, 0.9, 0.7, 0.8]

    def loop(epochs, resume):
        return small_loop(
            [
                Script("score", scores),
                FinishAfter(after_n_epochs=epochs),
                Checkpoint(str(tmp_path), save_best_of="score", best_mode="max", keep_last=None),
            ],
            resume_from=str(tmp_path) if resume else None,
        )

    loop(2, resume=False).run()
    second = read_checkpoint(list_checkpoints(str(tmp_path))[-1])
    assert second.loop_state["extensions"]["Checkpoint"]["best"]["value"] == 0.9
    resumed = loop(4, resume=True)
    resumed.extensions[0].fired = 2  # the scripted record goes on where it was
    resumed.run()
    best = read_checkpoint(str(tmp_path / "best"))
    assert best.loop_state["status"]["epochs_done"] == 2
    assert [
        row.get("score_best_checkpoint") for _, row in sorted(resumed.log.items()) if "score" in row
    ] == [0.5, 0.9, None, None]


def test_stale_temporaries_of_any_pid_are_cleaned_and_a_retired_best_put_back(tmp_path):
    best_keeping_loop(tmp_path, 1, resume=False).run()
    os.rename(tmp_path / "best", tmp_path / ".retired-best-0123456789ab")  # killed mid-replace
    os.makedirs(tmp_path / ".tmp-best-1")  # PID 1: a container's trainer
    os.makedirs(tmp_path / f".old-best-{os.getpid()}")  # this very PID, reused
    os.makedirs(tmp_path / ".tmp-checkpoint-000009-epoch0001-batch00000004-0123456789ab")
    resumed = best_keeping_loop(tmp_path, 1)
    resumed.run()  # nothing to train: it only tidies up
    assert read_checkpoint(str(tmp_path / "best")).loop_state["status"]["epochs_done"] == 1
    assert not [n for n in os.listdir(tmp_path) if n.startswith((".tmp", ".old", ".retired"))]
    for epochs in (3, 5):  # the best replaced again and again by one process
        best_keeping_loop(tmp_path, epochs).run()
    assert not [n for n in os.listdir(tmp_path) if n.startswith((".tmp", ".old", ".retired"))]


# ------------------------------------------------------------ 4. records of any type
class OddRecords(Extension):
    def __init__(self):
        super().__init__(after_epoch=True)

    def do(self, which_callback, *args):
        row = self.main_loop.log.current_row
        epoch = self.main_loop.status.epochs_done
        row["f32"] = np.float32(0.25 * epoch)
        row["i64"] = np.int64(epoch)
        row["nd"] = mx.nd.array([0.5 * epoch])
        row["array"] = np.arange(3) * epoch
        row["object"] = Extension
        row["score"] = mx.nd.array([1.0 / epoch])


def test_records_of_numpy_ndarray_and_object_types_are_saved_as_plain_values(tmp_path):
    loop = small_loop(
        [
            OddRecords(),
            FinishAfter(after_n_epochs=2),
            Checkpoint(str(tmp_path), save_best_of="score", best_mode="min"),
        ]
    ).run()
    saved = read_checkpoint(list_checkpoints(str(tmp_path))[-1])
    row = dict(saved.loop_state["log"]["rows"])[8]
    assert row["f32"] == 0.5 and row["i64"] == 2 and row["nd"] == 1.0
    assert row["array"] == [0, 2, 4] and "Extension" in row["object"]
    assert read_checkpoint(str(tmp_path / "best")).loop_state["status"]["epochs_done"] == 2
    assert loop.log[8]["score_best_checkpoint"] == 0.5


class UnsavableState(Extension):
    def state_dict(self):
        return {"handle": object()}


def test_an_extension_state_json_cannot_hold_is_named(tmp_path):
    with pytest.raises(CheckpointError, match="extension 'UnsavableState'"):
        small_loop(
            [UnsavableState(), FinishAfter(after_n_epochs=1), Checkpoint(str(tmp_path))]
        ).run()
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".tmp")]


# ------------------------------------------------------------ 5. disk faults
def test_a_file_size_limit_fails_the_save_with_its_cause_and_records_nothing(tmp_path):
    loop = small_loop([FinishAfter(after_n_epochs=2), Checkpoint(str(tmp_path))])
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    limit = 2000  # the parameters file is larger
    try:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
        with pytest.raises(CheckpointError) as info:
            loop.run()
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    message = str(info.value)
    assert "File too large" in message and "ulimit -f" in message
    assert "FileStream" not in message
    assert list_checkpoints(str(tmp_path)) == []
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".tmp")]  # no half-write left
    assert "checkpoint_saved_to" not in loop.log.record_names()
    assert loop.extensions[1].last_saved is None and loop.extensions[1].sequence == 0


def test_a_file_in_the_way_is_found_when_training_starts(tmp_path):
    (tmp_path / "taken").write_text("not a folder")
    loop = small_loop([FinishAfter(after_n_epochs=1), Checkpoint(str(tmp_path / "taken"))])
    with pytest.raises(CheckpointError, match="cannot write checkpoint .*taken") as info:
        loop.run()
    assert "move the file that is in the way" in str(info.value)
    assert loop.status.iterations_done == 0  # before the first batch


FAULT_RUN = r"""
import os, sys, json
sys.path[:0] = [{tests!r}]
from scripted import small_loop
from mxoid import Checkpoint, FinishAfter, CheckpointError
directory = sys.argv[1]
loop = small_loop([FinishAfter(after_n_epochs=2), Checkpoint(directory)], n=4000)
try:
    loop.run()
    result = {{"error": None}}
except CheckpointError as error:
    result = {{"error": str(error)}}
result["iterations"] = loop.status.iterations_done
result["left"] = sorted(os.listdir(directory)) if os.path.isdir(directory) else None
result["recorded"] = "checkpoint_saved_to" in loop.log.record_names()
print("RESULT " + json.dumps(result))
"""


def run_on_small_disk(tmp_path, options, prepare=""):
    """Run FAULT_RUN with its checkpoint directory on a small tmpfs of its own (a mount
    namespace that vanishes with the process)."""
    mount = tmp_path / "disk"
    script = tmp_path / "fault.py"
    script.write_text(FAULT_RUN.format(tests=os.path.dirname(os.path.dirname(__file__))))
    shell = f"{prepare} {sys.executable} {script} {mount / 'checkpoints'}"
    done = on_small_disk(mount, options, shell, timeout=120)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, done.stderr
    return json.loads(lines[0][7:])


def test_a_full_disk_fails_the_save_with_its_cause_and_frees_the_space(tmp_path):
    # 4000 samples: the parameters are tiny, but fill the disk first, leaving 8 KiB.
    result = run_on_small_disk(
        tmp_path,
        "size=512k",
        prepare=f"mkdir -p {tmp_path / 'disk' / 'checkpoints'} && "
        f"head -c 512000 /dev/zero > {tmp_path / 'disk' / 'filler'} 2>/dev/null;",
    )
    assert result["error"] is not None, result
    assert "No space left on device" in result["error"] and "free disk space" in result["error"]
    assert not [n for n in result["left"] if n.startswith(".tmp")]
    assert not result["recorded"]


def test_a_read_only_folder_is_found_when_training_starts(tmp_path):
    result = run_on_small_disk(tmp_path, "size=1m,ro")
    assert result["error"] is not None, result
    assert "Read-only file system" in result["error"] and result["iterations"] == 0


# ------------------------------------------------------------ 6. two runs, one folder
def test_two_runs_cannot_write_into_one_folder_at_once(tmp_path):
    directory = tmp_path / "checkpoints"
    other = Trainer(directory, "--epochs", "50", "--delay", "0.05")
    try:
        other.wait_for("BATCH 2")
        loop = make_loop(directory, FinishAfter(after_n_epochs=1), contexts=[mx.cpu()])
        with pytest.raises(CheckpointError, match="in use by another run") as info:
            loop.run()
        assert f'"pid": {other.process.pid}' in str(info.value)
    finally:
        other.process.kill()
        other.finish()
    lock = DirectoryLock(str(directory))  # released when its holder died
    lock.acquire()
    lock.release()


def test_info_logging_names_each_checkpoint_once_by_its_final_path(tmp_path, caplog):
    """As fit.py scripts set ``logging.basicConfig(level=logging.INFO)``: MXNet's own
    ``Saved checkpoint to`` line named the temporary folder, gone once the save is whole."""
    import logging

    with caplog.at_level(logging.INFO):
        make_loop(tmp_path, FinishAfter(after_n_epochs=2)).run()
    messages = [record.getMessage() for record in caplog.records]
    assert not [m for m in messages if ".tmp-" in m], messages
    saved = [m for m in messages if "checkpoint saved to" in m.lower()]
    folders = list_checkpoints(str(tmp_path))
    assert saved and all(os.path.isdir(m.split(" to ", 1)[1].strip('"')) for m in saved[-3:])
    assert len(saved) == len(set(saved)) and folders[-1] in saved[-1]
