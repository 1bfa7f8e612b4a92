"""Checkpoints: exact resumption, atomic writes, signals, damage, MXNet compatibility."""

import json
import os
import signal
import time

import mxnet as mx
import numpy as np
import pytest
from checkpointing import (
    Trainer,
    assert_identical,
    comparable_log,
    leftovers,
    make_loop,
    monitoring,
    params_of,
)
from conftest import TWO_CPUS, classification_data, initial_params, mlp

from mxoid import Checkpoint, CheckpointError, Extension, FinishAfter, MainLoop, read_log
from mxoid.checkpoint import latest_checkpoint, list_checkpoints, read_checkpoint
from mxoid.extensions import EarlyStopping


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
@pytest.mark.parametrize("stop_after_batches", [20, 25])  # 20: epoch boundary, 25: mid-epoch
def test_interrupted_and_resumed_equals_uninterrupted(tmp_path, optimizer, stop_after_batches):
    full = make_loop(
        tmp_path / "full", FinishAfter(after_n_epochs=4), optimizer=optimizer, extra=monitoring()
    ).run()
    make_loop(
        tmp_path / "cut",
        FinishAfter(after_n_batches=stop_after_batches),
        optimizer=optimizer,
        extra=monitoring(),
    ).run()
    np.random.seed(1234)  # whatever happened in between, resumption restores the random state
    resumed = make_loop(
        tmp_path / "cut",
        FinishAfter(after_n_epochs=4),
        optimizer=optimizer,
        resume=True,
        extra=monitoring(),
    )
    assert resumed.resumed_from is not None
    resumed.run()
    assert_identical(params_of(full), params_of(resumed))
    for field in ("iterations_done", "epochs_done", "iterations_done_in_epoch"):
        assert getattr(full.status, field) == getattr(resumed.status, field)
    full_log, resumed_log = comparable_log(full), comparable_log(resumed)
    assert "train_accuracy" in full_log[28] and "valid_cross_entropy" in full_log[40]
    assert "valid_cross_entropy_best_so_far" in full_log[40]
    early_full, early_resumed = (
        full.extensions[-1].state_dict(),
        resumed.extensions[-1].state_dict(),
    )
    assert (
        early_full == early_resumed
        and early_full != EarlyStopping("valid_accuracy", patience=10).state_dict()
    )
    # The cut run stopped (and saved) at its own limit: only that row differs.
    resumed_log.pop(stop_after_batches, None)
    full_log.pop(stop_after_batches, None)
    assert full_log == resumed_log


class HookCounter(Extension):
    def __init__(self):
        super().__init__()
        self.calls = []

    def before_training(self):
        self.calls.append("before_training")

    def on_resumption(self):
        self.calls.append("on_resumption")


def test_resumption_fires_on_resumption_not_before_training(tmp_path):
    make_loop(tmp_path, FinishAfter(after_n_epochs=1)).run()
    counter = HookCounter()
    make_loop(tmp_path, FinishAfter(after_n_epochs=2), resume=True, extra=[counter]).run()
    assert counter.calls == ["on_resumption"]


def test_resumed_run_that_already_met_its_limit_trains_no_more(tmp_path):
    make_loop(tmp_path, FinishAfter(after_n_epochs=2)).run()
    again = make_loop(tmp_path, FinishAfter(after_n_epochs=2), resume=True)
    before = params_of(again)
    again.run()
    assert again.status.iterations_done == 20
    assert_identical(before, params_of(again))


def test_raised_limit_goes_on_to_it(tmp_path):
    make_loop(tmp_path, FinishAfter(after_n_epochs=2)).run()
    later = make_loop(tmp_path, FinishAfter(after_n_epochs=4), resume=True).run()
    assert (later.status.epochs_done, later.status.iterations_done) == (4, 40)


def test_a_setting_changed_on_resumption_wins_with_a_warning_at_the_users_line(tmp_path):
    """The warning names the setting and points at the line that built the loop."""
    make_loop(tmp_path, FinishAfter(after_n_batches=3), optimizer="sgd").run()
    X, y = classification_data(n=200)
    np.random.seed(5)
    net = mlp()
    with pytest.warns(
        UserWarning, match=r"the optimizer's lr=0\.05 given to this MainLoop"
    ) as seen:
        loop = MainLoop(
            net,
            mx.io.NDArrayIter(X, y, batch_size=20, shuffle=True, label_name="softmax_label"),
            contexts=TWO_CPUS,
            optimizer="sgd",
            optimizer_params={"learning_rate": 0.05, "momentum": 0.9},
            arg_params=initial_params(net, (20, 10)),
            extensions=[FinishAfter(after_n_epochs=1), Checkpoint(str(tmp_path))],
            resume_from=str(tmp_path),
        )
    changed = [w for w in seen if "given to this MainLoop" in str(w.message)]
    assert changed and all(w.filename == __file__ for w in changed)
    assert loop.optimizer.lr == 0.05 and loop.status.iterations_done == 3


def test_resume_from_a_folder_without_checkpoint_starts_from_scratch(tmp_path):
    with pytest.warns(UserWarning, match="no whole checkpoint"):
        loop = make_loop(tmp_path / "empty", FinishAfter(after_n_epochs=1), resume=True)
    assert loop.resumed_from is None and loop.status.iterations_done == 0


class PlainIter(mx.io.DataIter):
    """An iterator mxoid cannot reposition directly: it shuffles with NumPy at reset."""

    def __init__(self, X, y, batch_size):
        super().__init__(batch_size)
        self.X, self.y = X, y
        self.order = np.arange(len(X))
        self.cursor = 0

    @property
    def provide_data(self):
        return [mx.io.DataDesc("data", (self.batch_size, self.X.shape[1]))]

    @property
    def provide_label(self):
        return [mx.io.DataDesc("softmax_label", (self.batch_size,))]

    def reset(self):
        np.random.shuffle(self.order)
        self.cursor = 0

    def next(self):
        if self.cursor + self.batch_size > len(self.X):
            raise StopIteration
        rows = self.order[self.cursor : self.cursor + self.batch_size]
        self.cursor += self.batch_size
        return mx.io.DataBatch([mx.nd.array(self.X[rows])], [mx.nd.array(self.y[rows])], pad=0)


def test_iterator_without_direct_repositioning_is_replayed_with_a_warning(tmp_path):
    factory = lambda X, y: PlainIter(X, y, 20)  # noqa: E731
    full = make_loop(
        tmp_path / "full", FinishAfter(after_n_epochs=3), iterator_factory=factory
    ).run()
    make_loop(tmp_path / "cut", FinishAfter(after_n_batches=15), iterator_factory=factory).run()
    with pytest.warns(UserWarning, match=r"reset 1 time\(s\) and 5 batch\(es\) are skipped"):
        resumed = make_loop(
            tmp_path / "cut", FinishAfter(after_n_epochs=3), iterator_factory=factory, resume=True
        )
    resumed.run()
    assert_identical(params_of(full), params_of(resumed))


def test_checkpoint_loads_in_mxnet_and_predicts_like_the_loop(tmp_path):
    loop = make_loop(tmp_path, FinishAfter(after_n_epochs=2), contexts=[mx.cpu()]).run()
    newest = list_checkpoints(str(tmp_path))[-1]
    epoch = loop.status.epochs_done
    symbol, arg_params, aux_params = mx.model.load_checkpoint(os.path.join(newest, "model"), epoch)
    X, y = classification_data(n=200)
    probe = mx.io.NDArrayIter(X[:40], y[:40], batch_size=20, label_name="softmax_label")
    module = mx.mod.Module.load(os.path.join(newest, "model"), epoch, context=mx.cpu())
    module.bind(probe.provide_data, probe.provide_label, for_training=False)
    theirs = module.predict(probe).asnumpy()
    manager = loop.manager.evaluation_manager(probe.provide_data, probe.provide_label)
    ours = []
    probe.reset()
    for batch in probe:
        manager.load_data_batch(batch)
        manager.forward(is_train=False)
        ours.append(manager.outputs["softmax"][0].asnumpy())
    np.testing.assert_allclose(np.concatenate(ours), theirs, rtol=1e-6, atol=1e-7)
    assert symbol.tojson() == loop.symbol.tojson()
    assert_identical({k: v.asnumpy() for k, v in arg_params.items()}, params_of(loop))


def test_damaged_checkpoint_names_the_file_and_latest_falls_back(tmp_path):
    make_loop(tmp_path, FinishAfter(after_n_epochs=2)).run()
    newest, previous = list_checkpoints(str(tmp_path))[-1], list_checkpoints(str(tmp_path))[-2]
    params_file = [f for f in os.listdir(newest) if f.endswith(".params")][0]
    with open(os.path.join(newest, params_file), "r+b") as handle:
        handle.truncate(100)
    with pytest.raises(CheckpointError, match=params_file) as info:
        read_checkpoint(newest)
    assert "Stack trace" not in str(info.value)
    with pytest.warns(UserWarning, match="damaged"):
        assert latest_checkpoint(str(tmp_path)).path == previous
    with pytest.warns(UserWarning, match="damaged"):
        resumed = make_loop(tmp_path, FinishAfter(after_n_epochs=2), resume=True)
    assert resumed.resumed_from == previous


def test_garbage_in_loop_state_is_reported_with_its_file(tmp_path):
    make_loop(tmp_path, FinishAfter(after_n_batches=3)).run()
    newest = list_checkpoints(str(tmp_path))[-1]
    with open(os.path.join(newest, "loop.json"), "w") as handle:
        handle.write("{not json")
    with pytest.raises(CheckpointError, match="loop.json"):
        read_checkpoint(newest)


def test_checkpoint_folder_without_manifest_is_incomplete(tmp_path):
    make_loop(tmp_path, FinishAfter(after_n_batches=3)).run()
    newest = list_checkpoints(str(tmp_path))[-1]
    os.remove(os.path.join(newest, "MANIFEST.json"))
    with pytest.raises(CheckpointError, match="incomplete"):
        read_checkpoint(newest)


@pytest.fixture(scope="module")
def reference_params(tmp_path_factory):
    """Final parameters of the checkpointed script run without interruption."""
    folder = tmp_path_factory.mktemp("reference")
    run = Trainer(
        folder / "checkpoints", "--every-n-batches", "3", "--output", str(folder / "params.npz")
    )
    code, err = run.finish(120)
    assert code == 0, err
    return dict(np.load(folder / "params.npz"))


@pytest.mark.parametrize("prefetch", [0, 3], ids=["read-in-place", "prefetch-3-ahead"])
def test_sigkill_always_leaves_a_checkpoint_to_resume_from(tmp_path, reference_params, prefetch):
    """Killed between batches, then twice in the middle of a checkpoint write; with
    Prefetch, while batches read ahead on its thread are not trained yet: none is lost,
    none is trained twice."""
    directory = tmp_path / "killed"
    for moment in ("BATCH 5", "WRITING", "WRITING"):
        args = [
            "--every-n-batches",
            "3",
            "--resume",
            "--delay",
            "0.01",
            "--prefetch",
            str(prefetch),
        ]
        if moment == "WRITING":
            args += ["--slow-write", "5"]
        run = Trainer(directory, *args)
        run.wait_for(moment)
        run.process.send_signal(signal.SIGKILL)
        code, _ = run.finish()
        assert code == -signal.SIGKILL
        assert latest_checkpoint(str(directory)) is not None  # a whole checkpoint is there
        if moment == "WRITING":
            assert [n for n in os.listdir(directory) if n.startswith(".tmp-")]  # killed mid-write
    output = tmp_path / "resumed.npz"
    run = Trainer(
        directory,
        "--every-n-batches",
        "3",
        "--resume",
        "--output",
        str(output),
        "--prefetch",
        str(prefetch),
    )
    code, err = run.finish(120)
    assert code == 0, err
    assert_identical(reference_params, dict(np.load(output)))
    assert not leftovers(directory)  # half-writes cleaned up


@pytest.mark.parametrize(
    "signals, code, stops_at",
    [
        ([signal.SIGTERM], 128 + signal.SIGTERM, "batch"),
        ([signal.SIGINT], 128 + signal.SIGINT, "epoch"),
        ([signal.SIGINT, signal.SIGINT], 128 + signal.SIGINT, "batch"),
    ],
)
@pytest.mark.parametrize("every", [None, 1], ids=["epochs", "every-batch"])
def test_signals_stop_cleanly_with_a_checkpoint(tmp_path, signals, code, stops_at, every):
    """And the interruption is still in the log after a resumption, also when a periodic
    checkpoint was saved in the very batch the signal arrived in."""
    log = tmp_path / "log.jsonl"
    periodic = [] if every is None else ["--every-n-batches", str(every)]
    run = Trainer(
        tmp_path / "checkpoints", "--epochs", "50", "--delay", "0.02", "--log", str(log), *periodic
    )
    line = run.wait_for("BATCH 13")
    for signum in signals:
        run.process.send_signal(signum)
        time.sleep(0.05)
    started = time.monotonic()
    returncode, err = run.finish(30)
    assert time.monotonic() - started < 30
    assert returncode == code, err
    assert "resume_from=" in err and str(tmp_path / "checkpoints") in err
    checkpoint = latest_checkpoint(str(tmp_path / "checkpoints"))
    status = checkpoint.loop_state["status"]
    assert status["interrupted"] in ("SIGINT", "SIGTERM")
    batches = [int(line.split()[1]) for line in run.lines if line.startswith("BATCH")]
    assert status["iterations_done"] == batches[-1]
    if stops_at == "epoch":
        assert status["iterations_done"] % 10 == 0 and not status["epoch_started"]
    else:
        assert status["iterations_done"] < int(line.split()[1]) + 5
    # The log inside the checkpoint holds the interruption.
    rows = dict((i, r) for i, r in checkpoint.loop_state["log"]["rows"])
    assert "interrupted by" in json.dumps(rows)
    # The log file was flushed up to the last batch, the interruption included.
    written = read_log(str(log))
    assert written[-1]["iteration"] == status["iterations_done"]
    assert written[-1]["training_finish_requested"].startswith("interrupted by")
    # Resumed to the end of the epoch after: the interruption stays where it was.
    resumed = Trainer(tmp_path / "checkpoints", "--resume", "--epochs", "3", "--log", str(log))
    returncode, err = resumed.finish(120)
    assert returncode == 0, err
    stop_row = {r["iteration"]: r for r in read_log(str(log))}[status["iterations_done"]]
    assert stop_row["training_finish_requested"].startswith("interrupted by")
    final = dict(latest_checkpoint(str(tmp_path / "checkpoints")).loop_state["log"]["rows"])
    assert final[status["iterations_done"]]["training_finish_requested"].startswith("interrupted")


def test_signal_handlers_are_restored_after_training(tmp_path):
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    make_loop(tmp_path, FinishAfter(after_n_batches=2)).run()
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
