"""Printing and ProgressBar: what they show, and when they stay quiet."""

import io
import os
import time

import mxnet as mx
import numpy as np
import pytest
from conftest import classification_data
from scripted import Script, small_loop
from slow_ops import register_slow_identity

from mxoid import Extension, FinishAfter, MainLoop, Printing, ProgressBar, TrackBest
from mxoid.data.position import batches_per_epoch


def test_printing_reports_status_and_records_after_each_epoch_and_at_the_end(capsys):
    loop = small_loop(
        [
            Printing(verbose=True),
            Script("valid_loss", [0.5, np.float32(0.25)]),
            FinishAfter(after_n_epochs=2),
        ]
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
        [
            Printing(verbose=True, every_n_batches=2, after_training=False),
            FinishAfter(after_n_epochs=1),
        ]
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
            extensions=[
                FinishAfter(after_n_epochs=limit),
                Printing(verbose=True),
                Checkpoint(str(tmp_path)),
            ],
            resume_from=str(tmp_path) if resume else None,
        )

    loop(1, False).run()
    capsys.readouterr()
    loop(2, True).run()
    out = capsys.readouterr().out
    assert out.index("TRAINING RESUMED") < out.index("AFTER ANOTHER EPOCH")
    assert "epochs_done: 1" in out.split("AFTER ANOTHER EPOCH")[0]


def test_printing_says_one_line_when_training_starts_each_epoch_and_at_the_end(capsys):
    import re

    small_loop(
        [
            Printing(every_n_batches=3),
            Script("valid_loss", [0.5, np.float32(0.25)]),
            TrackBest("valid_loss"),
            FinishAfter(after_n_epochs=2),
        ],
        contexts=[mx.cpu(0), mx.cpu(1)],
    ).run()
    lines = re.sub(r"\d+\.\d\d? s", "T s", capsys.readouterr().out).splitlines()
    # valid_loss_best_so_far and TrackBest's markers are in the log, not on the line.
    assert lines == [
        "Training starts: 4 batches per epoch of 25 samples on 2 devices (cpu(0), cpu(1)).",
        "Batch 3/4 · epoch 1/2 · T s",
        "Epoch 1/2 · T s · valid_loss 0.5000",
        "Batch 2/4 · epoch 2/2 · T s",
        "Epoch 2/2 · T s · valid_loss 0.2500",
        "Training finished after 2 epochs and 8 batches (T s): FinishAfter: 2 epochs done.",
    ]


def test_printing_without_an_epoch_limit_counts_epochs_alone(capsys):
    small_loop([Printing(), FinishAfter(after_n_batches=6)]).run()
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith("Epoch 1 · ") and len(lines) == 3
    assert lines[2].startswith("Training finished after 1 epoch and 6 batches (")
    assert lines[2].endswith("FinishAfter: 6 batches done.")


class Budget(Extension):
    """A stop of one's own that plans its epochs: Printing shows them, as FinishAfter's."""

    stops_training = True

    def __init__(self, epochs, **kwargs):
        kwargs.setdefault("after_epoch", True)
        super().__init__(**kwargs)
        self.epochs = epochs

    @property
    def planned_epochs(self):
        return self.epochs

    def do(self, which_callback, *args):
        if self.main_loop.status.epochs_done >= self.epochs:
            self.main_loop.request_stop(f"budget of {self.epochs} epochs spent")


def test_printing_asks_every_extension_for_its_planned_epochs(capsys):
    small_loop([Printing(), Budget(2), FinishAfter(after_n_epochs=5)]).run()
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith("Epoch 1/2 · ") and lines[2].startswith("Epoch 2/2 · ")
    assert FinishAfter(after_n_epochs=5).planned_epochs == 5
    assert Extension().planned_epochs is None
    assert FinishAfter(after_n_batches=5).planned_epochs is None


class Sleep(Extension):
    """Host work of its own in every batch: ``seconds`` a batch."""

    def __init__(self, seconds):
        super().__init__()
        self.seconds = seconds

    def after_batch(self, batch):
        time.sleep(self.seconds)


def seconds_of(line):
    import re

    return float(re.search(r" · (\d+\.\d+) s", line).group(1))


def test_the_seconds_of_an_epoch_are_its_own_and_the_last_line_gives_the_total(capsys):
    # 4 batches of 0.1 s an epoch: each epoch line says about 0.4 s, not the time so far.
    small_loop([Printing(), Sleep(0.1), FinishAfter(after_n_epochs=3)]).run()
    lines = capsys.readouterr().out.splitlines()
    epochs = [seconds_of(line) for line in lines if line.startswith("Epoch ")]
    assert len(epochs) == 3 and all(0.4 <= seconds < 0.8 for seconds in epochs), lines
    total = float(lines[-1].split("(")[1].split(" s)")[0])
    assert 1.2 <= total and sum(epochs) <= total + 0.01, lines


def test_the_default_line_shows_what_fits_in_100_columns_watched_records_first(capsys):
    from mxoid import EarlyStopping, Monitor

    names = [f"record_{i}" for i in range(12)] + ["valid_accuracy", "valid_cross_entropy"]
    small_loop(
        [Script(name, [0.001234, 0.5]) for name in names]
        + [
            Script("time_epoch", [1.0, 2.0]),  # Timing's records: left out
            Monitor("fc1_weight", every_n_batches=4),  # monitor_*: left out
            EarlyStopping("valid_cross_entropy", patience=5),
            TrackBest("valid_accuracy", mode="max"),
            Printing(),
            FinishAfter(after_n_epochs=2),
        ]
    ).run()
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("Epoch")]
    assert len(lines) == 2 and all(len(line) < 100 for line in lines), lines
    # The records the loop reacts to first, then the others, shown in the order written.
    first = lines[0].split(" · ")
    assert first[:2] == ["Epoch 1/2", first[1]] and first[-2:] == [
        "valid_acc 0.001234",
        "valid_ce 0.001234",
    ]
    assert first[2] == "record_0 0.001234" and "record_11" not in lines[0]
    # The same records on every line, whatever their values.
    assert [item.split()[0] for item in lines[1].split(" · ")[2:]] == [
        item.split()[0] for item in first[2:]
    ]
    assert "monitor_" not in lines[0] and "time_epoch" not in lines[0]
    assert "best" not in lines[0] and lines[1].endswith("valid_ce 0.5000")


def test_printing_shows_the_records_asked_for(capsys):
    from mxoid import Monitor

    loop = small_loop(
        [
            Script("valid_loss", [0.5, 0.25]),
            TrackBest("valid_loss"),
            Monitor("fc1_weight", every_n_batches=4),
            Printing(records=["monitor_*", "valid_loss_best_so_far", "not_there"]),
            Printing(records="valid_loss", name="one"),
            FinishAfter(after_n_epochs=2),
        ]
    ).run()
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("Epoch")]
    monitored = [name for name in loop.log[4] if name.startswith("monitor_")]
    assert monitored and lines[0].split(" · ")[2:] == [
        f"{name} {loop.log[4][name]:#.4g}" for name in monitored
    ] + ["valid_loss_best_so_far 0.5000"]
    assert lines[1].endswith(" s · valid_loss 0.5000")


def test_an_ascii_terminal_gets_bars_instead_of_dots(monkeypatch):
    import sys

    screen = io.TextIOWrapper(io.BytesIO(), encoding="ascii")
    monkeypatch.setattr(sys, "stdout", screen)
    small_loop([Printing(), Script("valid_loss", [0.5]), FinishAfter(after_n_epochs=1)]).run()
    screen.seek(0)
    assert screen.read().splitlines()[1].endswith(" s | valid_loss 0.5000")


def test_printing_through_python_logging(caplog):
    import logging

    with caplog.at_level(logging.INFO, logger="training"):
        small_loop(
            [Printing(logger=logging.getLogger("training")), FinishAfter(after_n_epochs=1)]
        ).run()
    messages = [r.getMessage() for r in caplog.records if r.name == "training"]
    assert messages[0].startswith("Training starts: 4 batches per epoch")
    assert messages[1].startswith("Epoch 1/1 · ")
    assert messages[2].startswith("Training finished after 1 epoch and 4 batches")


FORWARDS = []  # one entry per forward pass the engine has run of SlowIdentity


register_slow_identity("mxoid_slow_identity", 0.02, FORWARDS)  # 20 ms a pass


class CountWhatIsComputed(Extension):
    """After the bar: how far its count is behind the loop, and ahead of the engine."""

    def __init__(self, bar, sleep=0.0):
        super().__init__(priority=400)
        self.bar, self.sleep, self.behind, self.ahead, self.counts = bar, sleep, [], [], []

    def after_batch(self, batch):
        status = self.main_loop.status
        done_before = status.iterations_done - status.iterations_done_in_epoch
        self.behind.append(status.iterations_done - done_before - self.bar.computed)
        self.ahead.append(done_before + self.bar.computed - len(FORWARDS))
        self.counts.append((time.perf_counter(), self.bar.computed))
        time.sleep(self.sleep)  # a loop with host work of its own


def slow_network_loop(bar, probe, epochs=2):
    data = mx.sym.Variable("data")
    slow = mx.sym.Custom(data, op_type="mxoid_slow_identity")
    net = mx.sym.SoftmaxOutput(mx.sym.FullyConnected(slow, num_hidden=3, name="fc"), name="softmax")
    X, y = classification_data(n=200)  # 20 batches an epoch
    FORWARDS.clear()
    MainLoop(
        net,
        mx.io.NDArrayIter(X, y, batch_size=10),
        extensions=[bar, probe, FinishAfter(after_n_epochs=epochs)],
    ).run()


def test_the_progress_bar_catching_up_at_every_batch_counts_all_but_the_last():
    bar = ProgressBar(disable=False, file=io.StringIO(), mininterval=0)
    probe = CountWhatIsComputed(bar)
    slow_network_loop(bar, probe)
    assert max(probe.ahead) <= 0  # never a batch counted before the engine computed it
    assert probe.behind == [1] * 40  # each batch waits for the one before
    assert bar.computed == 20  # every batch of the epoch counted at its end


def test_the_progress_bar_catches_up_at_most_every_mininterval_and_never_counts_ahead():
    bar = ProgressBar(disable=False, file=io.StringIO(), mininterval=0.05)
    probe = CountWhatIsComputed(bar, sleep=0.01)  # 20 batches: >= 0.2 s of host time
    slow_network_loop(bar, probe, epochs=1)
    assert max(probe.ahead) <= 0
    catch_ups = [t for (t, c), (_, before) in zip(probe.counts[1:], probe.counts) if c != before]
    assert len(catch_ups) >= 2  # the count moved during the epoch, not only at its end
    assert all(b - a >= 0.05 for a, b in zip(catch_ups, catch_ups[1:]))
    assert max(probe.behind) > 1  # between catch-ups the loop ran ahead of the count
    assert bar.computed == 20


def test_a_progress_bar_that_draws_nothing_counts_only_at_the_epoch_end():
    bar = ProgressBar(disable=True, mininterval=0)
    probe = CountWhatIsComputed(bar)
    slow_network_loop(bar, probe, epochs=1)
    assert [c for _, c in probe.counts] == [0] * 20  # no wait for the engine in the epoch
    assert bar.computed == 20


def test_the_progress_bar_stays_readable_on_a_narrow_terminal(monkeypatch):
    import shutil

    monkeypatch.setattr(
        shutil, "get_terminal_size", lambda fallback=None: os.terminal_size((80, 24))
    )
    screen = io.StringIO()
    names = [f"record_{i}" for i in range(12)]
    small_loop(
        [ProgressBar(disable=False, file=screen)]
        + [Script(name, [0.123456]) for name in names]
        + [FinishAfter(after_n_epochs=1)]
    ).run()
    last = screen.getvalue().split("\r")[-1]
    assert "record_0=0.123456" in last and "record_11" not in last
