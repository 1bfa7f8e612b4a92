"""FinishAfter(seconds=), EarlyStopping, NaNGuard and TrackBest on scripted and real runs."""

import math
import time

import mxnet as mx
import numpy as np
import pytest
from scripted import Script, small_loop

from mxoid import EarlyStopping, Extension, FinishAfter, NaNGuard
from mxoid.checkpoint import latest_checkpoint
from mxoid.extensions import Checkpoint

NAN = float("nan")


# ------------------------------------------------------------------ EarlyStopping
@pytest.mark.parametrize(
    "values, mode, patience, min_delta, stop_epoch, best",
    [
        ([1.0, 0.8, 0.9, 0.85, 0.7, 0.6], "min", 2, 0.0, 4, 0.8),  # no better at 3 and 4
        (
            [1.0, 0.8, 0.9, 0.7, 0.75, 0.72, 0.1],
            "min",
            2,
            0.0,
            6,
            0.7,
        ),  # improving resets the count
        ([1.0, 0.95, 0.93, 0.5], "min", 2, 0.1, 3, 1.0),  # gains under min_delta don't count
        ([0.5, 0.6, 0.6, 0.59, 0.9], "max", 2, 0.0, 4, 0.6),  # equal is no improvement
        ([0.5, NAN, NAN, 0.9], "max", 2, 0.0, 3, 0.5),  # NaN is no improvement
        ([3.0, 2.0, 1.0, 0.5, 0.4, 0.3, 0.2, 0.1], "min", 1, 0.0, None, 0.1),  # always improving
    ],
)
def test_early_stopping_stops_at_the_right_epoch(
    values, mode, patience, min_delta, stop_epoch, best
):
    stopper = EarlyStopping("valid_loss", patience=patience, mode=mode, min_delta=min_delta)
    loop = small_loop(
        [Script("valid_loss", values), stopper, FinishAfter(after_n_epochs=len(values))]
    ).run()
    assert stopper.best.value == best
    if stop_epoch is None:
        assert loop.status.epochs_done == len(values)
        assert loop.status.stop_reason.startswith("FinishAfter")
        return
    assert loop.status.epochs_done == stop_epoch
    reason = loop.status.stop_reason
    assert reason.startswith(f"EarlyStopping: valid_loss has not improved on {best:.6g}")
    assert f"for {patience} checks" in reason
    assert loop.log[4 * stop_epoch]["training_finish_requested"] == reason


def test_early_stopping_counts_each_value_once():
    # The record is written every other epoch; the stopper looks every epoch and
    # must not count the stale value again: stop at epoch 6, not before.
    class EveryOther(Script):
        def do(self, which_callback, *args):
            if self.main_loop.status.epochs_done % 2 == 0:
                super().do(which_callback, *args)

    loop = small_loop(
        [
            EveryOther("valid_loss", [1.0, 1.1, 1.2, 1.3]),
            EarlyStopping("valid_loss", patience=2, every_n_epochs=1),
            FinishAfter(after_n_epochs=10),
        ]
    ).run()
    assert loop.status.epochs_done == 6
    assert loop.status.stop_reason.startswith("EarlyStopping")


def test_early_stopping_sees_a_record_written_in_the_same_after_epoch_by_a_later_extension():
    # Listed first, it still runs after the writer (priority 10 vs 0).
    loop = small_loop(
        [
            EarlyStopping("valid_loss", patience=1),
            Script("valid_loss", [1.0, 2.0, 0.5]),
            FinishAfter(after_n_epochs=3),
        ]
    ).run()
    assert loop.status.epochs_done == 2


def resume(loop, extensions, finish_after):
    """A new loop carrying ``loop``'s log, status and extension states, as a checkpoint would."""
    state = loop.log.state_dict()
    state["status"].update(stop_requested=False, stop_reason=None, training_finished=False)
    new = small_loop(extensions + [FinishAfter(after_n_epochs=finish_after)])
    new.log.load_state_dict(state)
    for old_extension, extension in zip(loop.extensions, new.extensions):
        extension.load_state_dict(old_extension.state_dict())
    return new


def test_early_stopping_state_carries_over_a_resumption():
    values = [1.0, 0.8, 0.9, 0.85, 0.7]
    first = small_loop(
        [
            Script("valid_loss", values),
            EarlyStopping("valid_loss", patience=2),
            FinishAfter(after_n_epochs=3),
        ]
    ).run()
    assert first.status.epochs_done == 3 and first.extensions[1].checks_without_improvement == 1
    script = Script("valid_loss", values)
    script.fired = 3
    second = resume(first, [script, EarlyStopping("valid_loss", patience=2)], finish_after=10).run()
    # As an uninterrupted run: the fourth value is the second check without improvement.
    assert second.status.epochs_done == 4
    assert second.status.stop_reason.startswith("EarlyStopping")


def test_early_stopping_stops_again_on_resumption_when_patience_was_spent():
    first = small_loop(
        [
            Script("valid_loss", [1.0, 2.0, 3.0]),
            EarlyStopping("valid_loss", patience=2),
            FinishAfter(after_n_epochs=3),
        ]
    ).run()
    assert first.extensions[1].checks_without_improvement == 2  # FinishAfter ran first at 3 epochs
    second = resume(
        first, [Script("valid_loss", []), EarlyStopping("valid_loss", patience=2)], finish_after=10
    ).run()
    assert second.status.epochs_done == 3 and second.status.iterations_done == 12
    assert second.status.stop_reason.startswith("EarlyStopping")


def test_early_stopping_checks_on_resumption_a_record_it_had_not_seen():
    # The checkpoint was taken after the record was written but before the stopper read it.
    first = small_loop(
        [
            Script("valid_loss", [1.0, 2.0, 3.0]),
            EarlyStopping("valid_loss", patience=2),
            FinishAfter(after_n_epochs=3),
        ]
    )
    first.run()
    first.extensions[1].load_state_dict(
        {"value": 1.0, "iteration": 4, "checked_iteration": 8, "checks_without_improvement": 1}
    )
    second = resume(
        first, [Script("valid_loss", []), EarlyStopping("valid_loss", patience=2)], finish_after=10
    ).run()
    assert second.status.epochs_done == 3
    assert second.extensions[1].checks_without_improvement == 2


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(patience=0), "patience"),
        (dict(patience=2, mode="lowest"), "mode"),
        (dict(patience=2, min_delta=-1), "min_delta"),
    ],
)
def test_early_stopping_rejects_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        EarlyStopping("valid_loss", **kwargs)


# -------------------------------------------------------------------- FinishAfter
def test_finish_after_seconds_stops_training():
    class Slow(Extension):
        def after_batch(self, batch):
            time.sleep(0.02)

    start = time.monotonic()
    limit = FinishAfter(seconds=0.25)
    loop = small_loop([Slow(), limit]).run()
    elapsed = time.monotonic() - start
    assert loop.status.stop_reason.startswith("FinishAfter: time limit of 0.25 s reached")
    assert 0.25 <= limit.seconds_elapsed() < elapsed + 0.01
    assert 1 <= loop.status.iterations_done <= 13  # each batch sleeps 0.02 s


def test_finish_after_seconds_counts_time_before_a_resumption():
    limit = FinishAfter(seconds=5)
    limit.load_state_dict({"seconds_elapsed": 6.0})
    loop = small_loop([limit]).run()
    assert loop.status.iterations_done == 0 and "time limit" in loop.status.stop_reason
    assert limit.state_dict()["seconds_elapsed"] >= 6.0


def test_finish_after_keeps_its_batch_and_epoch_limits_with_seconds():
    loop = small_loop([FinishAfter(after_n_batches=6, seconds=60)]).run()
    assert loop.status.iterations_done == 6


@pytest.mark.parametrize("kwargs", [{}, {"seconds": 0}, {"seconds": -1.0}, {"seconds": "1h"}])
def test_finish_after_rejects_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        FinishAfter(**kwargs)


def test_finish_after_names_a_misspelt_keyword_as_every_extension_does():
    from mxoid import Printing

    with pytest.raises(TypeError, match="unexpected keyword argument 'after_n_epoch'"):
        FinishAfter(after_n_epoch=2)
    with pytest.raises(TypeError, match="unexpected keyword argument 'evry_n_batches'"):
        Printing(evry_n_batches=3)


@pytest.mark.parametrize(
    "limit, reason",
    [
        (dict(after_n_epochs=1), "FinishAfter: 1 epoch done"),
        (dict(after_n_epochs=2), "FinishAfter: 2 epochs done"),
        (dict(after_n_batches=1), "FinishAfter: 1 batch done"),
        (dict(after_n_batches=3), "FinishAfter: 3 batches done"),
    ],
)
def test_finish_after_counts_in_words(limit, reason):
    assert small_loop([FinishAfter(**limit)]).run().status.stop_reason == reason


def test_a_mistyped_record_is_warned_about_at_the_users_line():
    stopper = EarlyStopping("valid_los", patience=2)
    loop = small_loop([Script("valid_loss", [1.0, 0.5]), stopper, FinishAfter(after_n_epochs=2)])
    with pytest.warns(UserWarning, match="did you mean 'valid_loss'") as warned:
        loop.run()  # the line the warning points at
    (warning,) = [w for w in warned if "valid_los'" in str(w.message)]
    assert warning.filename == __file__ and warning.lineno == line_of("loop.run()  # the line")


def line_of(text):
    with open(__file__) as source:
        return next(number for number, line in enumerate(source, 1) if text in line)


# ----------------------------------------------------------------------- NaNGuard
class WeightNorm(Extension):
    """Records the norm of fc1_weight after every batch, and whether every parameter is finite."""

    def __init__(self, **kwargs):
        kwargs.setdefault("after_batch", True)
        super().__init__(**kwargs)

    def do(self, which_callback, *args):
        manager = self.main_loop.manager
        row = self.main_loop.log.current_row
        row["fc1_weight_norm"] = float(mx.nd.norm(manager.param_arrays[0][0]).asscalar())
        row["params_finite"] = all(
            bool(np.isfinite(p[0].asnumpy()).all()) for p in manager.param_arrays
        )


def diverging_loop(extensions):
    # A learning rate of 1000: the weights overflow to NaN within two epochs of 5 batches.
    return small_loop(extensions, batch_size=20, learning_rate=1e3)


def first_non_finite_iteration():
    loop = diverging_loop([WeightNorm(), FinishAfter(after_n_epochs=3)]).run()
    norms = {i: row["fc1_weight_norm"] for i, row in loop.log.items() if "fc1_weight_norm" in row}
    bad = [i for i, norm in sorted(norms.items()) if not math.isfinite(norm)]
    assert bad and 1 < bad[0] < 15 and bad[0] % 5 != 0, "the run should diverge mid-epoch"
    return bad[0]


def test_nan_guard_stops_a_diverging_run_right_after_the_first_nan():
    nan_at = first_non_finite_iteration()
    guard = NaNGuard("fc1_weight_norm", every_n_batches=1)
    loop = diverging_loop([WeightNorm(), guard, FinishAfter(after_n_epochs=3)]).run()
    assert loop.status.iterations_done == nan_at
    reason = loop.status.stop_reason
    assert reason.startswith("NaNGuard: record 'fc1_weight_norm' is nan")
    assert f"at iteration {nan_at} " in reason
    assert loop.log[nan_at]["nan_detected"] == "fc1_weight_norm"
    assert all(math.isfinite(loop.log[i]["fc1_weight_norm"]) for i in range(1, nan_at))


def test_nan_guard_keeps_checkpoints_finite(tmp_path):
    nan_at = first_non_finite_iteration()
    loop = diverging_loop(
        [
            WeightNorm(),
            NaNGuard("fc1_weight_norm", every_n_batches=1),
            Checkpoint(str(tmp_path), every_n_batches=1, keep_last=None),
            FinishAfter(after_n_epochs=3),
        ]
    ).run()
    saved = latest_checkpoint(str(tmp_path))
    assert saved.loop_state is not None and f"batch{nan_at - 1:08d}" in saved.path
    assert all(np.isfinite(v.asnumpy()).all() for v in saved.arg_params.values())
    assert "checkpoint_saved_to" not in loop.log[nan_at]


def test_nan_guard_checks_parameters_with_one_sync_per_check(monkeypatch):
    nan_at = first_non_finite_iteration()
    syncs = []

    class CountingGuard(NaNGuard):
        def do(self, which_callback, *args):
            real = mx.nd.NDArray.asnumpy
            monkeypatch.setattr(
                mx.nd.NDArray, "asnumpy", lambda array: syncs.append(which_callback) or real(array)
            )
            try:
                super().do(which_callback, *args)
            finally:
                monkeypatch.setattr(mx.nd.NDArray, "asnumpy", real)

    loop = diverging_loop(
        [CountingGuard(check_parameters=True, every_n_batches=1), FinishAfter(after_n_epochs=3)]
    ).run()
    assert loop.status.iterations_done == nan_at
    assert loop.log[nan_at]["nan_detected"] == "fc1_weight"
    reason = loop.status.stop_reason
    assert f"parameter 'fc1_weight' holds NaN or infinite values at iteration {nan_at} " in reason
    # One check per batch, plus one after the one epoch completed; one sync each.
    assert len(syncs) == nan_at + 1


def test_nan_guard_ignores_finite_values_and_stale_nan():
    loop = small_loop(
        [
            Script("valid_loss", [1.0, NAN]),
            NaNGuard("valid_loss", check_parameters=True),
            FinishAfter(after_n_epochs=4),
        ]
    ).run()
    assert loop.status.epochs_done == 2 and loop.log[8]["nan_detected"] == "valid_loss"
    loop = small_loop(
        [
            Script("valid_loss", [1.0, 2.0]),
            Script("other", [[1.0, math.inf]]),
            NaNGuard(["valid_loss", "other"]),
            FinishAfter(after_n_epochs=3),
        ]
    ).run()
    assert loop.status.epochs_done == 1 and loop.log[4]["nan_detected"] == "other"


def test_nan_guard_needs_something_to_watch():
    with pytest.raises(ValueError, match="records to watch"):
        NaNGuard(check_parameters=False)
    assert NaNGuard().check_parameters  # the parameters, by default
