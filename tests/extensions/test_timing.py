"""Timing: plausible figures, and a device wait only when it writes them."""

import os
import sys
import threading
import time
import traceback

import mxnet as mx
import pytest
from monitored import on_the_loops_threads
from scripted import small_loop

from mxoid import Extension, FinishAfter, Timing

SLEEP = 0.01


class Slow(Extension):
    """Sleeps before every batch, so each batch takes at least SLEEP seconds."""

    def before_batch(self, batch):
        time.sleep(SLEEP)


def _origin(frame):
    """``module.function`` of the innermost mxoid frame that asked for the wait."""
    for entry in reversed(traceback.extract_stack(frame)):
        path = entry.filename.replace(os.sep, "/")
        if "/mxoid/" in path and entry.name not in ("synchronize", "wait_for"):
            return f"{os.path.basename(path)[:-3]}.{entry.name}"
    return "elsewhere"


@pytest.fixture
def waits(monkeypatch):
    """Where the engine waits (``mx.nd.waitall``) of this test's loop come from: each
    named by where the main thread asked for it; only the loop's (:func:`on_the_loops_threads`)."""
    calls = []
    real = mx.nd.waitall

    def counted():
        if on_the_loops_threads():  # on the waiter thread: where the main thread stands
            calls.append(_origin(sys._current_frames().get(threading.main_thread().ident)))
        return real()

    monkeypatch.setattr(mx.nd, "waitall", counted)
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
    assert waits == ["timing._start", "timing.do", "timing.do", "epochs.finish"]
    assert not any("time_per_batch" in loop.log.get(i, {}) for i in (1, 2, 3, 5, 6, 7))


def test_timing_every_n_batches_waits_only_when_writing(waits):
    loop = small_loop([Slow(), Timing(every_n_batches=2), FinishAfter(after_n_epochs=2)]).run()
    written = [i for i, row in loop.log.items() if "time_total" in row]
    assert written == [2, 4, 6, 8]
    # start, four batch writes, two epoch writes, the end
    assert waits == ["timing._start"] + ["timing.do"] * (4 + 2) + ["epochs.finish"]
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
