"""TrackBest: the best value of a record and its iteration, and the new-best flag."""

import pytest
from scripted import Script, small_loop

from mxoid import FinishAfter, TrackBest

NAN = float("nan")


# ---------------------------------------------------------------------- TrackBest
@pytest.mark.parametrize(
    "mode, best_so_far, best_epoch",
    [
        ("min", [3.0, 1.0, 1.0, 0.5, 0.5, 0.5], [1, 2, 2, 4, 4, 4]),
        ("max", [3.0, 3.0, 3.0, 3.0, 4.0, 4.0], [1, 1, 1, 1, 5, 5]),
    ],
)
def test_track_best_keeps_the_best_value_and_its_iteration(mode, best_so_far, best_epoch):
    values = [3.0, 1.0, 2.0, 0.5, 4.0, NAN]
    tracker = TrackBest("valid_loss", mode=mode)
    loop = small_loop([tracker, Script("valid_loss", values), FinishAfter(after_n_epochs=6)]).run()
    for epoch in range(1, 7):
        row = loop.log[4 * epoch]
        assert row["valid_loss_best_so_far"] == best_so_far[epoch - 1]
        assert row["valid_loss_best_iteration"] == 4 * best_epoch[epoch - 1]
    assert tracker.state_dict() == {
        "value": best_so_far[-1],
        "iteration": 4 * best_epoch[-1],
        "checked_iteration": 24,
    }


def test_track_best_ignores_stale_values_and_reads_records_between_epochs():
    tracker = TrackBest("train_loss", every_n_batches=2)
    script = Script("train_loss", [5.0, 4.0, 6.0], after_epoch=False, after_n_batches=3)
    script.add_condition("after_batch", lambda status: status.iterations_done in (2, 4))
    loop = small_loop([script, tracker, FinishAfter(after_n_epochs=1)]).run()
    # Written at batches 2, 3 and 4; the tracker looks at 2 and 4 (and after the epoch, at 4).
    assert loop.log[2]["train_loss_best_so_far"] == 5.0
    assert "train_loss_best_so_far" not in loop.log[3]
    assert loop.log[4]["train_loss_best_so_far"] == 5.0  # 6.0 at batch 4; 4.0 was never seen
    assert tracker.best.iteration == 2
