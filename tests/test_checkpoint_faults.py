"""Checkpoints under faults: other runs in the folder, kills at each step of a save, a full or
read-only disk, damaged and malformed checkpoints, resumption with other settings, signals
during the epoch-end hooks, and bad input. Nothing lost, nothing mislabelled, a clear message.
"""

import hashlib
import json
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import time

import mxnet as mx
import numpy as np
import pytest
from conftest import classification_data, initial_params, mlp
from scripted import Script, small_loop
from test_checkpoint import Trainer, assert_identical, make_loop, params_of

from mxoid import (
    Checkpoint,
    CheckpointError,
    EarlyStopping,
    Evaluate,
    Extension,
    FinishAfter,
    JSONLinesLog,
    MainLoop,
    NaNGuard,
    TrainingMonitoring,
    read_log,
)
from mxoid.checkpoint import DirectoryLock, ResumeError, list_checkpoints, read_checkpoint


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


def test_a_folder_whose_checkpoints_are_all_damaged_is_an_error_not_a_fresh_start(tmp_path):
    make_loop(tmp_path, FinishAfter(after_n_epochs=1)).run()
    for folder in list_checkpoints(str(tmp_path)):
        os.remove(os.path.join(folder, "MANIFEST.json"))
    with pytest.warns(UserWarning, match="damaged"), pytest.raises(
        CheckpointError, match="every checkpoint in .* is damaged"
    ):
        make_loop(tmp_path, FinishAfter(after_n_epochs=2), resume=True)


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


# ------------------------------------------------------------ 3. kills inside a save
@pytest.fixture(scope="module")
def reference_run(tmp_path_factory):
    """The checkpointed script without interruption: its parameters and its log file."""
    folder = tmp_path_factory.mktemp("reference")
    run = Trainer(
        folder / "checkpoints",
        "--every-n-batches",
        "3",
        "--best",
        "--output",
        str(folder / "params.npz"),
        "--log",
        str(folder / "log.jsonl"),
    )
    code, err = run.finish(120)
    assert code == 0, err
    return dict(np.load(folder / "params.npz")), comparable_file_rows(folder / "log.jsonl")


@pytest.mark.parametrize(
    "point, batch", [("manifest", 6), ("rename", 6), ("saved", 7), ("saved", 10), ("retire", 10)]
)
def test_a_kill_inside_a_save_loses_nothing(tmp_path, reference_run, point, batch):
    """SIGKILL at one step of the save of a batch, then resume: parameters, the whole log
    file and the best checkpoint equal the uninterrupted run's."""
    directory, log = tmp_path / "checkpoints", tmp_path / "log.jsonl"
    common = ["--every-n-batches", "3", "--best", "--log", str(log)]
    run = Trainer(directory, *common, "--kill-at", point, "--kill-batch", str(batch))
    code, _ = run.finish(60)
    assert code == -signal.SIGKILL
    if point == "retire":
        assert not (directory / "best").exists()  # killed between the two renames
    output = tmp_path / "params.npz"
    code, err = Trainer(directory, *common, "--resume", "--output", str(output)).finish(120)
    assert code == 0, err
    params, rows = reference_run
    assert_identical(params, dict(np.load(output)))
    assert comparable_file_rows(log) == rows
    assert read_checkpoint(str(directory / "best")).loop_state["status"]["iterations_done"] > 0
    assert not [n for n in os.listdir(directory) if n.startswith((".tmp", ".retired", ".del"))]


def test_random_kills_lose_no_row_of_the_log_file(tmp_path, reference_run):
    directory, log = tmp_path / "checkpoints", tmp_path / "log.jsonl"
    common = ["--every-n-batches", "3", "--best", "--log", str(log), "--delay", "0.01"]
    rng = random.Random(20261201)
    output = tmp_path / "params.npz"
    for _attempt in range(6):
        run = Trainer(directory, *common, "--resume", "--output", str(output))
        run.wait_for(("BATCH", "DONE"), timeout=60)
        time.sleep(rng.uniform(0.0, 0.6))
        run.process.send_signal(signal.SIGKILL)
        code, _ = run.finish()
        if code == 0:
            break
    code, err = Trainer(directory, *common, "--resume", "--output", str(output)).finish(120)
    assert code == 0, err
    params, rows = reference_run
    assert_identical(params, dict(np.load(output)))
    assert comparable_file_rows(log) == rows


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
    with pytest.raises(CheckpointError, match="cannot write checkpoint .*taken"):
        loop.run()
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
    mount.mkdir()
    script = tmp_path / "fault.py"
    script.write_text(FAULT_RUN.format(tests=os.path.dirname(__file__)))
    user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    shell = (
        f"mount -t tmpfs -o {options} tmpfs {mount} && {prepare} "
        f"{sys.executable} {script} {mount / 'checkpoints'}"
    )
    done = subprocess.run(
        ["unshare", *user, "--mount", "sh", "-c", shell],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
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


# ------------------------------------------------------------ 7. what resume_from takes
def test_resume_from_best_or_one_folder_resumes_exactly_that_checkpoint(tmp_path):
    best_keeping_loop(tmp_path, 3, resume=False).run()
    for folder in (tmp_path / "best", list_checkpoints(str(tmp_path))[0]):
        saved = read_checkpoint(str(folder))
        loop = small_loop([FinishAfter(after_n_epochs=3)], resume_from=str(folder))
        assert loop.resumed_from == str(folder)
        assert loop.status.iterations_done == saved.loop_state["status"]["iterations_done"]
        assert_identical({k: v.asnumpy() for k, v in saved.arg_params.items()}, params_of(loop))


def test_a_mistyped_resume_from_is_an_error(tmp_path):
    best_keeping_loop(tmp_path / "checkpoints", 1, resume=False).run()
    with pytest.raises(ValueError, match="does not exist"):
        small_loop([FinishAfter(after_n_epochs=2)], resume_from=str(tmp_path / "chekpoints"))
    with pytest.raises(ValueError, match="is a file"):
        small_loop(
            [FinishAfter(after_n_epochs=2)],
            resume_from=str(tmp_path / "checkpoints" / ".mxoid-lock"),
        )


# ------------------------------------------------------------ 8. malformed checkpoints
def tamper_manifest_files(folder):
    edit_manifest(folder, lambda manifest: manifest.pop("files"))


def tamper_status(folder):
    with open(os.path.join(folder, "loop.json")) as handle:
        state = json.load(handle)
    del state["status"]
    rewrite(folder, "loop.json", json.dumps(state).encode())


def tamper_position(folder):
    with open(os.path.join(folder, "loop.json")) as handle:
        state = json.load(handle)
    del state["data_position"]
    rewrite(folder, "loop.json", json.dumps(state).encode())


def tamper_states(folder):
    rewrite(folder, "optimizer.states", b"garbage that is not a pickle")


def tamper_states_missing(folder):
    os.remove(os.path.join(folder, "optimizer.states"))
    edit_manifest(folder, lambda manifest: manifest["files"].pop("optimizer.states"))


def params_file(folder):
    return [name for name in os.listdir(folder) if name.endswith(".params")][0]


def tamper_missing_parameter(folder):
    name = params_file(folder)
    saved = mx.nd.load(os.path.join(folder, name))
    del saved["arg:fc1_weight"]
    mx.nd.save(os.path.join(folder, name), saved)
    with open(os.path.join(folder, name), "rb") as handle:
        rewrite(folder, name, handle.read())


def tamper_nan_parameter(folder):
    name = params_file(folder)
    saved = mx.nd.load(os.path.join(folder, name))
    saved["arg:fc2_bias"][:] = float("nan")
    mx.nd.save(os.path.join(folder, name), saved)
    with open(os.path.join(folder, name), "rb") as handle:
        rewrite(folder, name, handle.read())


@pytest.mark.parametrize(
    "tamper, names",
    [
        (tamper_manifest_files, "MANIFEST.json"),
        (tamper_status, "loop.json"),
        (tamper_position, "loop.json"),
        (tamper_states, "optimizer.states"),
        (tamper_states_missing, "optimizer.states"),
        (tamper_missing_parameter, "fc1_weight"),
        (tamper_nan_parameter, "fc2_bias"),
    ],
)
def test_a_malformed_checkpoint_is_named_and_resumption_falls_back(tmp_path, tamper, names):
    make_loop(tmp_path, FinishAfter(after_n_batches=7)).run()
    previous, newest = list_checkpoints(str(tmp_path))[-2:]
    tamper(newest)
    with pytest.warns(UserWarning, match=f"skipping a damaged checkpoint.*{names}"):
        resumed = make_loop(tmp_path, FinishAfter(after_n_epochs=2), resume=True)
    assert resumed.resumed_from == previous
    with pytest.raises(CheckpointError, match=names):
        MainLoop(
            resumed.symbol,
            resumed.train_data,
            contexts=resumed.contexts,
            optimizer="adam",
            extensions=[FinishAfter(after_n_epochs=2)],
            resume_from=newest,
        )


# ------------------------------------------------------------ 9. other settings
def saved_run(tmp_path):
    make_loop(tmp_path, FinishAfter(after_n_batches=7), optimizer="sgd").run()


def resume_with(tmp_path, **changes):
    X, y = classification_data(n=changes.pop("n", 200))
    np.random.seed(5)
    batch = changes.pop("batch_size", 20)
    train = mx.io.NDArrayIter(
        X, y, batch_size=batch, shuffle=changes.pop("shuffle", True), label_name="softmax_label"
    )
    net = changes.pop("net", mlp())
    params = {"learning_rate": 0.1, **changes.pop("optimizer_params", {})}
    if changes.get("optimizer", "sgd") == "sgd":
        params.setdefault("momentum", 0.9)
    return MainLoop(
        net,
        train,
        contexts=changes.pop("contexts", [mx.cpu(0), mx.cpu(1)]),
        optimizer=changes.pop("optimizer", "sgd"),
        optimizer_params=params,
        extensions=[FinishAfter(after_n_epochs=2)],
        resume_from=str(tmp_path),
    )


def test_a_new_learning_rate_is_used_and_said(tmp_path):
    saved_run(tmp_path)
    with pytest.warns(
        UserWarning,
        match=r"optimizer's lr=0.05 given to this MainLoop \(the run "
        r"started with 0.1",
    ):
        loop = resume_with(tmp_path, optimizer_params={"learning_rate": 0.05})
    assert loop.optimizer.lr == 0.05 and loop.optimizer.momentum == 0.9
    assert loop.optimizer.num_update == 7  # the state is the checkpoint's
    loop.run()


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"batch_size": 10}, "batch_size=20, this loop has batch_size=10"),
        ({"n": 180, "shuffle": False}, "it had 200 samples, this iterator has 180"),
        (
            {"net": mlp(num_hidden=8)},
            "another network .*fc1_weight: \\(16, 10\\) saved, \\(8, 10\\)",
        ),
        ({"optimizer": "adam"}, "trained with the optimizer SGD, this loop has Adam"),
        ({"contexts": [mx.cpu()]}, "num_devices=2, this loop has num_devices=1"),
    ],
)
def test_resuming_other_training_is_refused_naming_the_checkpoint(tmp_path, changes, message):
    saved_run(tmp_path)
    with pytest.raises(ResumeError, match=message) as info:
        resume_with(tmp_path, **changes)
    assert "checkpoint-" in str(info.value)


# ------------------------------------------------------------ 10. roll_over
@pytest.mark.parametrize("cut", [12, 14])  # 10 batches per epoch: after and inside epoch 2
def test_roll_over_iterators_resume_exactly(tmp_path, cut):
    def factory(X, y):
        return mx.io.NDArrayIter(
            X[:190],
            y[:190],
            batch_size=20,
            shuffle=True,  # noqa
            last_batch_handle="roll_over",
            label_name="softmax_label",
        )

    full = make_loop(
        tmp_path / "full",
        FinishAfter(after_n_batches=40),
        iterator_factory=factory,
        optimizer="sgd",
    ).run()
    make_loop(
        tmp_path / "cut",
        FinishAfter(after_n_batches=cut),
        iterator_factory=factory,
        optimizer="sgd",
    ).run()
    resumed = make_loop(
        tmp_path / "cut",
        FinishAfter(after_n_batches=40),
        resume=True,
        iterator_factory=factory,
        optimizer="sgd",
    ).run()
    assert_identical(params_of(full), params_of(resumed))


# ------------------------------------------------------------ 11. optimizer instances
def test_an_optimizer_instance_keeps_its_multipliers_and_gets_modules_warning():
    X, y = classification_data()
    net = mlp()
    optimizer = mx.optimizer.SGD(learning_rate=0.5, rescale_grad=1.0)
    optimizer.set_lr_mult({"fc1_weight": 0.0})
    start = initial_params(net, (20, 10))
    with pytest.warns(UserWarning, match="rescale_grad is not normalized"):
        loop = MainLoop(
            net,
            mx.io.NDArrayIter(X, y, batch_size=20),
            optimizer=optimizer,
            arg_params=start,
            extensions=[FinishAfter(after_n_epochs=1)],
        )
    loop.run()
    params = params_of(loop)
    assert_identical(
        {"fc1_weight": start["fc1_weight"].asnumpy()}, {"fc1_weight": params["fc1_weight"]}
    )
    assert not np.array_equal(params["fc2_weight"], start["fc2_weight"].asnumpy())


def test_symbol_lr_mult_attributes_apply_to_an_optimizer_instance():
    X, y = classification_data()
    data = mx.sym.Variable("data")
    frozen = mx.sym.Variable("fc1_weight", lr_mult=0.0)
    hidden = mx.sym.FullyConnected(data, weight=frozen, num_hidden=16, name="fc1")
    net = mx.sym.SoftmaxOutput(
        mx.sym.FullyConnected(hidden, num_hidden=3, name="fc2"), name="softmax"
    )
    start = initial_params(net, (20, 10))
    loop = MainLoop(
        net,
        mx.io.NDArrayIter(X, y, batch_size=20),
        optimizer=mx.optimizer.SGD(learning_rate=0.5, rescale_grad=1 / 20),
        arg_params=start,
        extensions=[FinishAfter(after_n_epochs=1)],
    ).run()
    np.testing.assert_array_equal(params_of(loop)["fc1_weight"], start["fc1_weight"].asnumpy())


# ------------------------------------------------------------ 12. signals
class SignalInAfterEpoch(Extension):
    def __init__(self, epoch):
        super().__init__(after_epoch=True, priority=100)
        self.epoch = epoch

    def do(self, which_callback, *args):
        if self.main_loop.status.epochs_done == self.epoch:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.1)  # the handler runs here, during the epoch-end hooks


def test_a_first_ctrl_c_during_the_epoch_end_hooks_stops_after_that_epoch(tmp_path):
    loop = small_loop(
        [SignalInAfterEpoch(1), FinishAfter(after_n_epochs=5), Checkpoint(str(tmp_path))],
        exit_on_interrupt=False,
    ).run()
    assert loop.status.epochs_done == 1 and loop.status.interrupted == "SIGINT"
    saved = read_checkpoint(list_checkpoints(str(tmp_path))[-1])
    assert saved.loop_state["status"]["interrupted"] == "SIGINT"


def test_a_ctrl_c_in_the_last_epoch_is_a_finished_run_not_an_interruption():
    loop = small_loop([SignalInAfterEpoch(3), FinishAfter(after_n_epochs=3)]).run()  # no exit
    assert loop.status.epochs_done == 3 and loop.status.interrupted is None
    assert loop.status.stop_reason.startswith("FinishAfter")


# ------------------------------------------------------------ 13. bad input
@pytest.mark.parametrize(
    "build, error, message",
    [
        (
            lambda: small_loop([FinishAfter(after_n_epochs=1)], contexts="cpu"),
            TypeError,
            "contexts must be an mx.Context or a list of them",
        ),
        (
            lambda: small_loop([FinishAfter(after_n_epochs=1)], contexts=[mx.gpu(0)]),
            ValueError,
            "CPU-only build",
        ),
        (
            lambda: small_loop(FinishAfter(after_n_epochs=1)),
            TypeError,
            r"extensions=\[FinishAfter\(...\)\]",
        ),
        (
            lambda: small_loop([FinishAfter(after_n_epochs=1)], initializer="xavier"),
            TypeError,
            "mx.init.Xavier()",
        ),
        (lambda: Checkpoint(""), ValueError, "needs a directory"),
        (
            lambda: small_loop(
                [
                    FinishAfter(after_n_epochs=1),
                    JSONLinesLog("/tmp/x/log.jsonl"),
                    JSONLinesLog("/tmp/x/../x/log.jsonl", name="again"),
                ]
            ),
            ValueError,
            "both write the log file",
        ),
    ],
)
def test_bad_input_gets_a_clear_error_at_construction(build, error, message):
    with pytest.raises(error, match=message):
        build()


@pytest.mark.parametrize(
    "watcher",
    [
        lambda: EarlyStopping("valid_acuracy", patience=2, mode="max"),
        lambda: NaNGuard("train_cross_entropi", check_parameters=False),
        lambda: Checkpoint(
            "/tmp/mxoid-never-written",
            every_n_epochs=None,
            after_training=False,
            on_interrupt=False,
            save_best_of="valid_acuracy",
        ),
    ],
)
def test_a_mistyped_record_is_warned_about_with_the_close_names(watcher):
    X, y = classification_data(n=60, seed=7)
    valid = mx.io.NDArrayIter(X, y, batch_size=20, label_name="softmax_label")
    with pytest.warns(UserWarning, match="'valid_acuracy'|'train_cross_entropi'") as warned:
        small_loop(
            [
                FinishAfter(after_n_epochs=2),
                Evaluate({"valid": valid}, ["acc", "ce"]),
                TrainingMonitoring(["acc", "ce"]),
                watcher(),
            ]
        ).run()
    said = " ".join(str(w.message) for w in warned)
    assert "did you mean 'valid_accuracy'" in said or "did you mean 'train_cross_entropy'" in said
    shutil.rmtree("/tmp/mxoid-never-written", ignore_errors=True)


def test_nan_inputs_stop_training_with_the_default_nan_guard():
    X, y = classification_data(n=100)
    X[37] = np.nan
    net = mlp()
    loop = MainLoop(
        net,
        mx.io.NDArrayIter(X, y, batch_size=25, label_name="softmax_label"),
        arg_params=initial_params(net, (25, 10)),
        extensions=[FinishAfter(after_n_epochs=5), NaNGuard()],
    ).run()
    assert loop.status.epochs_done == 1
    assert loop.log[4]["nan_detected"] in loop.manager.param_names
