"""Timing: plausible figures, and a device wait only when it writes them."""

import time

import mxnet as mx
import pytest
from scripted import small_loop

from mxoid import Extension, FinishAfter, Timing

SLEEP = 0.01


class Slow(Extension):
    """Sleeps before every batch, so each batch takes at least SLEEP seconds."""

    def before_batch(self, batch):
        time.sleep(SLEEP)


@pytest.fixture
def waits(monkeypatch):
    calls = []
    real = mx.nd.waitall
    monkeypatch.setattr(mx.nd, "waitall", lambda: calls.append(1) or real())
    return calls


def test_timing_records_plausible_figures_after_each_epoch(waits):
    start = time.perf_counter()
    loop = small_loop([Slow(), Timing(), FinishAfter(after_n_epochs=2)]).run()
    wall = time.perf_counter() - start
    rows = [loop.log[4], loop.log[8]]
    for row in rows:
        assert 4 * SLEEP <= row["time_epoch"] < wall
        assert row["time_per_batch"] == pytest.approx(row["time_epoch"] / 4)
        assert row["samples_per_second"] == pytest.approx(25 / row["time_per_batch"])
    assert rows[0]["time_total"] >= rows[0]["time_epoch"]
    assert rows[1]["time_total"] >= rows[0]["time_total"] + rows[1]["time_epoch"]
    assert rows[1]["time_total"] < wall
    # Once when training starts, once per write, and once (the loop's) when training
    # ends; never per batch.
    assert len(waits) == 1 + 2 + 1
    assert not any("time_per_batch" in loop.log.get(i, {}) for i in (1, 2, 3, 5, 6, 7))


def test_timing_every_n_batches_waits_only_when_writing(waits):
    loop = small_loop([Slow(), Timing(every_n_batches=2), FinishAfter(after_n_epochs=2)]).run()
    written = [i for i, row in loop.log.items() if "time_total" in row]
    assert written == [2, 4, 6, 8]
    assert len(waits) == 1 + 4 + 2 + 1  # start, four batch writes, two epoch writes, the end
    row = loop.log[6]
    assert SLEEP <= row["time_per_batch"] and "time_epoch" not in row
    assert row["samples_per_second"] == pytest.approx(25 / row["time_per_batch"])
    totals = [loop.log[i]["time_total"] for i in written]
    assert totals == sorted(totals)


def test_timing_continues_the_total_of_a_resumed_run():
    loop = small_loop([Timing(), FinishAfter(after_n_epochs=1)]).run()
    first_total = loop.log[4]["time_total"]
    state = loop.log.state_dict()
    state["status"].update(stop_requested=False, stop_reason=None, training_finished=False)
    resumed = small_loop([Timing(), FinishAfter(after_n_epochs=2)])
    resumed.log.load_state_dict(state)
    resumed.run()
    assert resumed.log[8]["time_total"] > first_total + resumed.log[8]["time_epoch"] * 0.99
