"""TensorBoard: event files that TensorBoard's own reader reads back as the log's records."""

import sys

import mxnet as mx
import numpy as np
import pytest
from conftest import classification_data
from scripted import small_loop

# TensorBoard's own reader (the 'tensorboard' package, in the test extra).
from tensorboard.backend.event_processing import event_accumulator

from mxoid import Checkpoint, Evaluate, Extension, FinishAfter, TrainingMonitoring
from mxoid.extensions import TensorBoard
from mxoid.extensions.tensorboard import TENSORBOARD_EXTRA
from mxoid.log.records import plain_value


class Records(Extension):
    """Records of every kind, in several hooks: some numeric, some not."""

    def before_training(self):
        self.main_loop.log.current_row["started_with"] = 7

    def before_epoch(self):
        # Lands in the row of the previous epoch's end, after that row's after_epoch.
        self.main_loop.log.current_row["epoch_started"] = self.main_loop.status.epochs_done

    def after_batch(self, batch):
        status = self.main_loop.status
        row = self.main_loop.log.current_row
        row["float_record"] = status.iterations_done / 3
        row["numpy_record"] = np.float32(status.iterations_done) * np.float32(0.5)
        row["ndarray_record"] = mx.nd.array([status.iterations_done * 2.0])
        row["flag"] = True
        row["note"] = "text"
        row["vector"] = [1.0, 2.0]


def read_events(logdir):
    reader = event_accumulator.EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    reader.Reload()
    return {
        tag: [(event.step, event.value) for event in reader.Scalars(tag)]
        for tag in reader.Tags()["scalars"]
    }


def expected_scalars(log, wanted=lambda name: True):
    expected = {}
    for iteration, row in log.items():
        for name, value in row.items():
            value = plain_value(value)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and wanted(name):
                expected.setdefault(name, []).append((iteration, float(value)))
    return expected


def assert_same(events, expected):
    assert sorted(events) == sorted(expected)
    for tag, points in expected.items():
        steps = [step for step, _ in events[tag]]
        assert steps == [step for step, _ in points], tag
        values = [value for _, value in events[tag]]
        assert values == pytest.approx([value for _, value in points], rel=1e-6, nan_ok=True), tag


def evaluation():
    X, y = classification_data(n=60, seed=3)
    return Evaluate(
        {"valid": mx.io.NDArrayIter(X, y, batch_size=20, label_name="softmax_label")}, ["acc", "ce"]
    )


def test_event_files_hold_every_numeric_record_at_its_iteration(tmp_path):
    loop = small_loop(
        [
            FinishAfter(after_n_epochs=3),
            TrainingMonitoring("acc", every_n_batches=3),
            evaluation(),
            Records(),
            TensorBoard(tmp_path / "tb"),
        ]
    )
    loop.run()
    events = read_events(tmp_path / "tb")
    expected = expected_scalars(loop.log)
    assert set(expected) == {
        "started_with",
        "epoch_started",
        "float_record",
        "numpy_record",
        "ndarray_record",
        "train_accuracy",
        "valid_accuracy",
        "valid_cross_entropy",
    }
    assert_same(events, expected)
    assert events["started_with"] == [(0, 7.0)]
    assert [step for step, _ in events["valid_accuracy"]] == [4, 8, 12]  # 4 batches an epoch
    assert [step for step, _ in events["epoch_started"]] == [0, 4, 8]
    assert events["ndarray_record"][-1] == (12, 24.0)


class ReadEventsAfterEpoch(Extension):
    """Runs after TensorBoard (higher priority) and reads its files during training."""

    def __init__(self, logdir):
        super().__init__(priority=2000, after_epoch=True)
        self.logdir, self.seen = logdir, []

    def do(self, which_callback, *args):
        events = read_events(self.logdir)
        self.seen.append([step for step, _ in events.get("valid_accuracy", [])])


def test_epoch_records_reach_the_files_during_training(tmp_path):
    reader = ReadEventsAfterEpoch(tmp_path / "tb")
    small_loop(
        [FinishAfter(after_n_epochs=2), evaluation(), TensorBoard(tmp_path / "tb"), reader]
    ).run()
    assert reader.seen == [[4], [4, 8]]


def test_records_chosen_by_name_and_pattern(tmp_path):
    loop = small_loop(
        [
            FinishAfter(after_n_epochs=2),
            TrainingMonitoring("acc"),
            evaluation(),
            TensorBoard(tmp_path / "tb", records=["valid_*", "train_accuracy"]),
        ]
    )
    loop.run()
    events = read_events(tmp_path / "tb")
    assert sorted(events) == ["train_accuracy", "valid_accuracy", "valid_cross_entropy"]
    assert_same(events, expected_scalars(loop.log, lambda name: name in events))


class FailAt(Extension):
    def __init__(self, batch):
        super().__init__()
        self.batch = batch

    def after_batch(self, batch):
        if self.main_loop.status.iterations_done == self.batch:
            raise RuntimeError("crash")


def test_resumed_run_replaces_what_the_crashed_run_wrote_after_its_checkpoint(tmp_path):
    def loop(*extra, resume=False):
        return small_loop(
            [
                FinishAfter(after_n_epochs=3),
                TrainingMonitoring("acc", every_n_batches=1),
                evaluation(),
                Checkpoint(str(tmp_path / "ckpt")),
                TensorBoard(tmp_path / "tb"),
                *extra,
            ],
            resume_from=str(tmp_path / "ckpt") if resume else None,
        )

    with pytest.raises(RuntimeError, match="crash"):
        loop(FailAt(6)).run()  # checkpoint after epoch 1 (batch 4); rows up to 6 written
    crashed = read_events(tmp_path / "tb")
    assert [step for step, _ in crashed["train_accuracy"]] == [1, 2, 3, 4, 5, 6]
    resumed = loop(resume=True)
    resumed.run()
    # Batches 5 and 6 were trained again after resumption: each step once, with the new values.
    assert_same(read_events(tmp_path / "tb"), expected_scalars(resumed.log))


def test_without_tensorboardx_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboardX", None)
    with pytest.raises(ImportError) as error:
        TensorBoard(tmp_path)
    assert str(error.value) == TENSORBOARD_EXTRA
    assert "pip install 'mxoid[tensorboard]'" in TENSORBOARD_EXTRA
