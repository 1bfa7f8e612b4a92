"""The Extension API: firing conditions beside overridden hooks, predicates on the log,
OnLogRecord, the counts on any hook, the row a record lands in, attach."""

import mxnet as mx
import pytest
from conftest import classification_data
from scripted import Script, small_loop

from mxoid import Evaluate, Extension, FinishAfter, OnLogRecord, TrackBest
from mxoid.extensions import (
    FIRING_KEYWORDS,
    HOOKS,
    after_n_batches,
    after_n_epochs,
    every_n_batches,
    every_n_epochs,
)


class OverridesAfterEpoch(Extension):
    """Overrides after_epoch without calling super(), and has do() with every_n_batches."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.epochs, self.fired = [], []

    def after_epoch(self):
        self.epochs.append(self.main_loop.status.epochs_done)

    def do(self, which_callback, *args):
        self.fired.append((which_callback, self.main_loop.status.iterations_done))


def test_an_overridden_hook_never_disables_the_firing_conditions():
    extension = OverridesAfterEpoch(every_n_batches=3, every_n_epochs=2)
    small_loop([extension, FinishAfter(after_n_epochs=2)]).run()  # 4 batches per epoch
    assert extension.epochs == [1, 2]
    assert extension.fired == [("after_batch", 3), ("after_batch", 6), ("after_epoch", 8)]


class CallsSuper(OverridesAfterEpoch):
    def after_epoch(self):
        self.fired.append(("before super", self.main_loop.status.epochs_done))
        super().after_epoch()  # the conditions fire here, once


def test_an_override_that_calls_super_fires_the_conditions_where_it_calls_it():
    extension = CallsSuper(after_epoch=True)
    small_loop([extension, FinishAfter(after_n_epochs=2)]).run()
    assert extension.fired == [
        ("before super", 1),
        ("after_epoch", 4),
        ("before super", 2),
        ("after_epoch", 8),
    ]


class Recorder(Extension):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.fired = []

    def do(self, which_callback, *args):
        self.fired.append((which_callback, self.main_loop.status.iterations_done))


def test_on_log_record_fires_exactly_where_the_record_was_written():
    record = OnLogRecord("score")
    recorder = Recorder()
    recorder.add_condition("after_batch", record).add_condition("after_epoch", record)
    script = Script("score", [1.0, 2.0, 3.0], after_epoch=False)
    script.add_condition("after_batch", lambda log: log.status.iterations_done in (2, 7))
    script.add_condition("after_epoch", lambda log: log.status.epochs_done == 2)
    small_loop([script, recorder, FinishAfter(after_n_epochs=3)]).run()
    assert recorder.fired == [("after_batch", 2), ("after_batch", 7), ("after_epoch", 8)]


def test_checkpoint_the_best_model_is_track_best_plus_a_condition():
    scores = [0.5, 0.9, 0.7, 0.95, 0.2]
    keeper = Recorder(priority=20)
    keeper.add_condition("after_epoch", OnLogRecord("score_new_best"))
    small_loop(
        [
            Script("score", scores),
            TrackBest("score", mode="max"),
            keeper,
            FinishAfter(after_n_epochs=5),
        ]
    ).run()
    assert keeper.fired == [("after_epoch", 4), ("after_epoch", 8), ("after_epoch", 16)]


def test_predicates_receive_the_log_and_status_style_predicates_still_work():
    seen = []
    recorder = Recorder()
    recorder.add_condition(
        "after_batch",
        lambda log: (
            seen.append(type(log).__name__)
            or log.iterations_done == 3
            and log.status["epochs_done"] == 0
        ),
    )
    small_loop([recorder, FinishAfter(after_n_epochs=1)]).run()
    assert recorder.fired == [("after_batch", 3)] and set(seen) == {"TrainingLog"}


def test_one_table_of_firing_keywords():
    assert set(FIRING_KEYWORDS) == set(HOOKS) | {
        "every_n_batches",
        "every_n_epochs",
        "after_n_batches",
        "after_n_epochs",
    }
    with pytest.raises(ValueError, match="unknown hook"):
        Extension().add_condition("after_everything")


def test_attach_gives_the_loop():
    recorder = Recorder(after_epoch=True)
    loop = small_loop([recorder, FinishAfter(after_n_epochs=1)])
    assert recorder.main_loop is loop


# ------------------------------------------------------------ the row a record lands in
class WritesAtEveryHook(Extension):
    """Writes ``<hook>`` = the batches done, at every hook of a batch."""

    def _write(self, hook):
        self.main_loop.log.current_row[hook] = self.main_loop.status.iterations_done

    def before_batch(self, batch):
        self._write("before_batch")

    def after_backward(self, batch):
        self._write("after_backward")

    def before_update(self):
        self._write("before_update")

    def after_update(self):
        self._write("after_update")

    def after_batch(self, batch):
        self._write("after_batch")


def test_records_written_during_a_batch_land_in_the_row_of_that_batch():
    """From after_backward to after_batch, the current row is the batch's own (as Evaluate's
    records of that batch); before_batch writes in the row before, as it always did."""
    X, y = classification_data(n=50, seed=3)
    valid = mx.io.NDArrayIter(X, y, batch_size=25, label_name="softmax_label")
    writer = WritesAtEveryHook()
    evaluation = Evaluate({"valid": valid}, [mx.metric.Accuracy()], every_n_batches=2)
    loop = small_loop([writer, evaluation, FinishAfter(after_n_epochs=1)]).run()
    log = loop.log
    for batch in range(1, 5):  # counted from 1: row b is the row of the b-th batch
        assert log[batch]["after_backward"] == batch - 1  # the count comes after the step
        assert log[batch]["before_update"] == log[batch]["after_update"] == batch - 1
        assert log[batch]["after_batch"] == batch
        assert log[batch - 1]["before_batch"] == batch - 1
    assert {b for b in log if "valid_accuracy" in log[b]} == {2, 4}
    assert all("after_backward" in log[b] for b in (2, 4))


def test_on_log_record_sees_a_record_of_after_backward_in_the_same_batch():
    written = Script("peek", [1.0, 2.0], after_epoch=False)
    written.add_condition("after_backward", every_n_batches(3))
    seen = Recorder()
    seen.add_condition("after_update", OnLogRecord("peek"))
    small_loop([written, seen, FinishAfter(after_n_epochs=2)]).run()
    assert seen.fired == [("after_update", 2), ("after_update", 5)]  # batches 3 and 6


# ------------------------------------------------------------ counts on any hook
class Counted(Extension):
    """Notes (hook, batches done, epochs done) whenever a condition holds."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.fired = []

    def do(self, which_callback, *args):
        status = self.main_loop.status
        self.fired.append((which_callback, status.iterations_done, status.epochs_done))


def test_a_hook_keyword_given_n_fires_that_hook_of_every_nth_batch_or_epoch():
    """As Ignite's Events.X(every=n); a batch's hooks count batches, an epoch's epochs."""
    counted = Counted(
        before_batch=3, after_backward=3, after_update=3, before_epoch=2, after_epoch=2
    )
    small_loop([counted, FinishAfter(after_n_epochs=4)]).run()  # 4 batches per epoch
    at = {hook: [(i, e) for h, i, e in counted.fired if h == hook] for hook in HOOKS}
    # The 3rd, 6th... batch: 2, 5... batches done before its count.
    assert at["before_batch"] == at["after_backward"] == at["after_update"]
    assert at["after_backward"] == [(2, 0), (5, 1), (8, 2), (11, 2), (14, 3)]
    assert at["before_epoch"] == [(4, 1), (12, 3)]  # the 2nd and 4th epochs start
    assert at["after_epoch"] == [(8, 2), (16, 4)]
    assert not at["after_batch"]


def test_counts_fire_any_hook_by_the_number_of_the_batch_or_epoch_it_belongs_to():
    counted = Counted()
    counted.add_condition("before_update", after_n_batches(6))
    counted.add_condition("after_batch", every_n_epochs(2))  # every batch of epoch 2
    counted.add_condition("before_epoch", after_n_epochs(2))
    counted.add_condition("after_training", every_n_batches(4))
    small_loop([counted, FinishAfter(after_n_epochs=2)]).run()
    assert counted.fired == [
        ("before_epoch", 4, 1),
        ("after_batch", 5, 1),
        ("before_update", 5, 1),
        ("after_batch", 6, 1),
        ("after_batch", 7, 1),
        ("after_batch", 8, 1),
        ("after_training", 8, 2),
    ]


def test_conditions_add_up_as_in_blocks():
    """Each keyword adds a condition of its own hook: after_backward=True fires at every
    backward, every_n_batches=4 at every 4th after_batch, and neither limits the other."""
    counted = Counted(after_backward=True, every_n_batches=4)
    small_loop([counted, FinishAfter(after_n_epochs=2)]).run()
    assert [i for h, i, _ in counted.fired if h == "after_backward"] == list(range(8))
    assert [i for h, i, _ in counted.fired if h == "after_batch"] == [4, 8]


@pytest.mark.parametrize(
    "keywords, message",
    [
        ({"after_training": 2}, "after_training takes True or False"),
        ({"after_backward": 0}, "after_backward takes True, or a positive int n: every n-th batch"),
        ({"after_epoch": 1.5}, "every n-th epoch"),
    ],
)
def test_a_hook_keyword_takes_true_or_a_count_where_it_counts(keywords, message):
    with pytest.raises(ValueError, match=message):
        Counted(**keywords)
    with pytest.raises(ValueError, match="every_n_batches needs a positive int"):
        every_n_batches(0)
