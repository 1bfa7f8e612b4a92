"""Printing and ProgressBar: what they show, and when they stay quiet."""

import io

import mxnet as mx
import numpy as np
import pytest
from scripted import Script, small_loop

from mxoid import FinishAfter, Printing, ProgressBar
from mxoid.checkpoint.data_position import batches_per_epoch


def test_printing_reports_status_and_records_after_each_epoch_and_at_the_end(capsys):
    loop = small_loop(
        [Printing(), Script("valid_loss", [0.5, np.float32(0.25)]), FinishAfter(after_n_epochs=2)]
    ).run()
    out = capsys.readouterr().out
    assert out.count("AFTER ANOTHER EPOCH") == 2 and out.count("TRAINING HAS BEEN FINISHED") == 1
    epochs = out.split("AFTER ANOTHER EPOCH")
    assert "Log records from the iteration 4:" in epochs[1] and "valid_loss: 0.5\n" in epochs[1]
    assert "epochs_done: 1\n" in epochs[1]
    assert "valid_loss: 0.25\n" in epochs[2] and "iterations_done: 8\n" in epochs[2]
    assert "training_finish_requested: FinishAfter: 2 epochs done" in out
    assert not loop.log.get(1)  # printing never creates rows


def test_printing_every_n_batches(capsys):
    small_loop(
        [Printing(every_n_batches=2, after_training=False), FinishAfter(after_n_epochs=1)]
    ).run()
    out = capsys.readouterr().out
    assert out.count("AFTER ANOTHER BATCH") == 2 and out.count("AFTER ANOTHER EPOCH") == 1
    assert "TRAINING HAS BEEN FINISHED" not in out


def test_progress_bar_shows_batches_and_newest_records_when_forced():
    screen = io.StringIO()
    loop = small_loop(
        [
            ProgressBar(disable=False, file=screen),
            Script("valid_loss", [0.5, 0.125]),
            FinishAfter(after_n_epochs=2),
        ]
    ).run()
    text = screen.getvalue()
    assert "epoch 1" in text and "epoch 2" in text
    assert "4/4" in text  # the length is known from the iterator before the first epoch ends
    assert "valid_loss=0.5" in text and "valid_loss=0.125" in text
    bar = loop.extensions[0]
    assert bar.bar is None and bar.postfix == {"valid_loss": "0.125"}


def test_progress_bar_closes_when_training_stops_mid_epoch():
    screen = io.StringIO()
    loop = small_loop(
        [ProgressBar(disable=False, file=screen), FinishAfter(after_n_batches=6)]
    ).run()
    assert loop.extensions[0].bar is None
    assert "epoch 2" in screen.getvalue() and "2/4" in screen.getvalue()


@pytest.mark.parametrize("disable, file_is_terminal", [(None, False), (True, True)])
def test_progress_bar_stays_quiet_off_a_terminal_or_when_disabled(
    capsys, disable, file_is_terminal
):
    class Terminal(io.StringIO):
        def isatty(self):
            return file_is_terminal

    screen = Terminal()
    small_loop([ProgressBar(disable=disable, file=screen), FinishAfter(after_n_epochs=1)]).run()
    small_loop([ProgressBar(disable=disable), FinishAfter(after_n_epochs=1)]).run()
    assert screen.getvalue() == ""
    captured = capsys.readouterr()
    assert captured.err == "" and captured.out == ""


def test_progress_bar_draws_on_a_terminal_by_default():
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    screen = Terminal()
    small_loop([ProgressBar(file=screen), FinishAfter(after_n_epochs=1)]).run()
    assert "4/4" in screen.getvalue()


def test_batches_per_epoch_from_the_iterator():
    X = np.zeros((10, 3), dtype="float32")
    assert batches_per_epoch(mx.io.NDArrayIter(X, batch_size=4)) == 3
    assert batches_per_epoch(mx.io.NDArrayIter(X, batch_size=4, last_batch_handle="discard")) == 2
    assert batches_per_epoch(mx.io.ResizeIter(mx.io.NDArrayIter(X, batch_size=4), 7)) == 7
    assert batches_per_epoch([1, 2]) == 2
    assert batches_per_epoch(iter([1, 2])) is None


def test_printing_reports_a_resumption(tmp_path, capsys):
    import mxnet as mx
    from conftest import classification_data, mlp

    from mxoid import Checkpoint, FinishAfter, MainLoop, Printing

    X, y = classification_data(n=40)

    def loop(limit, resume):
        train = mx.io.NDArrayIter(X, y, batch_size=20, label_name="softmax_label")
        return MainLoop(
            mlp(),
            train,
            extensions=[FinishAfter(after_n_epochs=limit), Printing(), Checkpoint(str(tmp_path))],
            resume_from=str(tmp_path) if resume else None,
        )

    loop(1, False).run()
    capsys.readouterr()
    loop(2, True).run()
    out = capsys.readouterr().out
    assert out.index("TRAINING RESUMED") < out.index("AFTER ANOTHER EPOCH")
    assert "epochs_done: 1" in out.split("AFTER ANOTHER EPOCH")[0]
