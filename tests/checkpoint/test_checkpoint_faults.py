"""Checkpoints under faults: other runs in the folder, kills at each step of a save, a full or
read-only disk, damaged and malformed checkpoints, resumption with other settings, signals
during the epoch-end hooks, and bad input. Nothing lost, nothing mislabelled, a clear message.
"""

import json
import os
import random
import shutil
import signal
import time

import mxnet as mx
import numpy as np
import pytest
from checkpointing import (
    Trainer,
    assert_identical,
    best_keeping_loop,
    comparable_file_rows,
    edit_manifest,
    make_loop,
    params_of,
    rewrite,
)
from conftest import classification_data, initial_params, mlp
from scripted import small_loop

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
)
from mxoid.checkpoint import ResumeError, list_checkpoints, read_checkpoint

pytestmark = pytest.mark.adversarial


def test_a_folder_whose_checkpoints_are_all_damaged_is_an_error_not_a_fresh_start(tmp_path):
    make_loop(tmp_path, FinishAfter(after_n_epochs=1)).run()
    for folder in list_checkpoints(str(tmp_path)):
        os.remove(os.path.join(folder, "MANIFEST.json"))
    with (
        pytest.warns(UserWarning, match="damaged"),
        pytest.raises(CheckpointError, match="every checkpoint in .* is damaged"),
    ):
        make_loop(tmp_path, FinishAfter(after_n_epochs=2), resume=True)


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
