"""The benchmarks' harness on small synthetic inputs: statistics, orders of rounds, turns,
targets and their verdicts, workers that hang, peak memory.

The suites themselves run in ``test_suites.py``.
"""

import importlib
import os
import subprocess
import sys
import time

import numpy as np
import pytest
from sizes import code_lines

BENCHMARKS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(__file__))), "benchmarks")
sys.path.insert(0, BENCHMARKS)
stats = importlib.import_module("harness.stats")
report = importlib.import_module("harness.report")
processes = importlib.import_module("harness.processes")
contest = importlib.import_module("harness.contest")
loop = importlib.import_module("suites.workloads.symbol")  # the symbol workload
targets = importlib.import_module("harness.targets")


def test_cells_name_their_optimizer():
    assert loop.parse_cells("mlp-32-1,mlp-32-2-adam,lenet-128-2-sgd") == (
        ("mlp", 32, 1, "momentum"),
        ("mlp", 32, 2, "adam"),
        ("lenet", 128, 2, "sgd"),
    )
    with pytest.raises(ValueError, match="unknown optimizer 'rmsprop'"):
        loop.parse_cells("mlp-32-1-rmsprop")
    assert loop.describe_cell(("mlp", 32, 2, "adam")) == "MLP b32 2 ctx, Adam"
    assert loop.describe_cell(("lenet", 128, 1, "momentum")) == "LeNet b128 1 ctx"


def test_a_throughput_ratio_carries_a_bootstrap_interval_and_the_verdict_reads_it():
    """The interval holds the ratio of the medians; a limit inside it is a miss within
    noise, one above it a plain miss."""

    def row(seconds):
        return {"samples_per_epoch": 100, "epoch_seconds": seconds}

    steady = row([[1.0, 1.01, 0.99], [1.0, 1.02, 0.98]])
    slower = row([[1.25, 1.3, 1.2], [1.24, 1.26, 1.25]])
    low, high = stats.ratio_interval(slower, steady)
    assert low <= 1.0 / 1.25 <= high and high < 0.9
    low, high = stats.ratio_interval(steady, steady)
    assert low <= 1.0 <= high
    noisy = row([[0.8, 1.4, 1.0], [1.2, 0.9, 1.1]])
    assert stats.ratio_interval(noisy, steady)[1] > 1.0 > stats.ratio_interval(noisy, steady)[0]
    assert targets.verdict({"met": False, "within_noise": True}) == "missed within noise"
    assert targets.verdict({"met": False, "within_noise": False}) == "MISSED"
    assert targets.verdict({"met": True}) == "met"
    assert stats.ratio_interval(row([]), steady) is None


def test_the_interval_carries_the_difference_between_runs_of_one_contender():
    """Runs of one contender at their own levels (steady epochs within each): the
    interval reaches the ratio a draw of the other runs gives, where resampling the
    pooled epochs alone would give a narrow interval around the median's ratio."""

    def row(seconds):
        return {"samples_per_epoch": 100, "epoch_seconds": seconds}

    steady = row([[1.0] * 5, [1.0] * 5, [1.0] * 5])
    levels = row([[1.0] * 5, [1.5] * 5, [1.5] * 5])  # median epoch 1.5 s: ratio 0.67
    low, high = stats.ratio_interval(levels, steady)
    assert low <= 1 / 1.5 + 1e-9 and high >= 1.0 - 1e-9
    assert stats.ratio_interval(steady, steady) == (1.0, 1.0)


def _interleaved_rows(seconds_by_contender):
    return {
        name: {"interleaved": True, "samples_per_epoch": 100, "epoch_seconds": runs}
        for name, runs in seconds_by_contender.items()
    }


def test_a_per_batch_cost_is_taken_round_by_round_with_its_interval():
    """An extension that adds 8 us to every batch while the machine's speed drifts by
    hundreds of microseconds from round to round measures 8 us, with a zero-width
    interval; one that adds 0 or 16 us in alternate rounds is uncertain about it."""
    rng = np.random.RandomState(5)
    bare = rng.uniform(300e-6, 700e-6, 100)
    estimate, (low, high) = stats.paired_difference(bare + 8e-6, bare)
    assert estimate == pytest.approx(8e-6)
    assert high - low < 1e-12
    alternating = bare + np.where(np.arange(100) % 2, 16e-6, 0.0)
    estimate, (low, high) = stats.paired_difference(alternating, bare)
    assert low < 8e-6 < high and high - low > 8e-6
    with pytest.raises(ValueError, match="no rounds"):
        stats.paired_difference([], [])


def test_round_by_round_ratios_see_through_what_disturbs_both_contenders():
    """The machine slows down and speeds up from round to round; a contender 10%
    slower than the other in every round is measured at 0.909, exactly, where the
    ratio of the medians of the same epochs unpaired is uncertain by +-5% and more."""
    rng = np.random.RandomState(3)
    levels = [rng.uniform(1.0, 1.6, 40) for _ in range(3)]
    rows = _interleaved_rows(
        {"hand": [list(level) for level in levels], "slow": [list(level * 1.1) for level in levels]}
    )
    estimate, (low, high) = stats.paired_ratio(rows["slow"], rows["hand"])
    assert estimate == pytest.approx(1 / 1.1)
    assert high - low < 1e-9
    unpaired = stats.ratio_interval(rows["slow"], rows["hand"])
    assert unpaired[0] < 1 / 1.1 < unpaired[1] and unpaired[1] - unpaired[0] > 0.09


def test_the_paired_interval_carries_a_process_that_favours_one_contender():
    """Processes are resampled too: a contender 20% slower in one process of three
    and level in the others is not certified level."""
    level = [1.0] * 20
    rows = _interleaved_rows({"hand": [level, level, level], "other": [level, level, [1.2] * 20]})
    estimate, (low, high) = stats.paired_ratio(rows["other"], rows["hand"])
    assert estimate == 1.0
    assert low <= 1 / 1.2 + 1e-9 and high == 1.0


def test_ratios_pair_rounds_only_between_rows_of_the_same_processes():
    rows = _interleaved_rows({"a": [[1.0, 1.0]], "b": [[1.0, 1.0], [1.0, 1.0]]})
    assert stats.paired_ratio(rows["a"], rows["b"]) is None  # different numbers of processes
    separate = {"samples_per_epoch": 100, "epoch_seconds": [[1.0, 1.0]]}
    assert stats.paired_ratio(separate, rows["a"]) is None
    # the harness falls back to the ratio of the medians for rows that cannot be paired
    separate["samples_per_second"] = {"median": 100.0}
    rows["a"]["samples_per_second"] = {"median": 50.0}
    ratio, interval = contest.throughput_ratio(rows["a"], separate)
    assert ratio == 0.5 and interval is not None


def test_host_time_is_compared_round_by_round_too():
    """The Python thread's CPU time slows down with the machine as wall time does: a
    contender 10% over the hand loop's host time in every round measures 1.10 whatever
    the rounds' levels; rows that cannot be paired give None (the ratio of medians then)."""
    rng = np.random.RandomState(4)
    levels = [rng.uniform(1.0, 2.0, 8) for _ in range(3)]
    hand = {"interleaved": True, "epoch_host_seconds": [list(level) for level in levels]}
    mine = {"interleaved": True, "epoch_host_seconds": [list(1.1 * level) for level in levels]}
    assert stats.paired_time_ratio(mine, hand) == pytest.approx(1.1)
    assert stats.paired_time_ratio(dict(mine, interleaved=False), hand) is None


def test_a_target_the_hand_loop_itself_misses_says_so():
    """The hand loop does the least work a loop can do; where it misses a ratio to
    Module.fit, no loop doing its work can meet it, and the verdict says so."""
    beyond = {"met": False, "limit": 1.5, "measured": 1.35, "unit": "x", "floor": 1.37}
    assert targets.verdict(beyond) == "missed by the floor too"
    assert targets.format_measured(beyond) == "1.35x; the hand loop: 1.37x"
    assert targets.VERDICT_CELLS[targets.verdict(beyond)] == "no, nor by the hand loop"
    reachable = dict(beyond, floor=1.6, within_noise=False)
    assert targets.verdict(reachable) == "MISSED"
    assert targets.verdict(dict(beyond, met=True)) == "met"


def test_only_the_stock_updaters_plain_sgd_gets_a_looser_tolerance():
    strict = (loop.RTOL, loop.ATOL)
    for contender in ("mxoid_bare", "mxoid_everyday", "hand_stock_updater", "module_fit_acc"):
        for optimizer in ("momentum", "adam"):
            assert loop.tolerance(contender, ("mlp", 32, 1, optimizer)) == strict
    assert loop.tolerance("mxoid_bare", ("mlp", 32, 1, "sgd")) == strict
    assert loop.tolerance("mxoid_everyday", ("mlp", 32, 2, "sgd")) == strict
    assert loop.tolerance("module_fit_acc", ("mlp", 32, 1, "sgd")) == (1e-3, 1e-4)


def test_the_memory_target_allows_what_mxoid_may_queue_ahead_and_no_more():
    from mxoid.executor_manager.pacing import QUEUED_INPUT_BUDGET

    assert loop.QUEUED_INPUT_MIB * 2**20 == QUEUED_INPUT_BUDGET


def test_markdown_tables_pad_and_align_their_columns():
    table = report.markdown_table("name|value", [["a", "1"], ["long name", "10"]], "lr")
    assert table.splitlines() == [
        "| name      | value |",
        "|-----------|------:|",
        "| a         |     1 |",
        "| long name |    10 |",
    ]
    columns = (("label", "{label}"), ("ms", "{times[ms]:.1f}"))
    assert "| x     | 1.2 |" in report.table_of(columns, [{"label": "x", "times": {"ms": 1.25}}])


def test_the_thread_settings_are_refused_once_mxnet_is_imported():
    """They are read by MXNet at its import: applied later they would change nothing."""
    import mxnet  # noqa: F401

    env = importlib.import_module("harness.env")
    with pytest.raises(RuntimeError, match="before MXNet is imported"):
        env.apply_thread_settings()


# ------------------------------------------------------------------ workers and turns
class SleepingLauncher:
    """Starts a real process that hangs, as a deadlocked worker does."""

    def start(self, spec_path):
        folder = os.path.dirname(spec_path)
        open(os.path.join(folder, "output.txt"), "w").close()
        return subprocess.Popen(["sleep", "60"], cwd=folder)


def test_a_hung_worker_is_killed_after_the_timeout_and_run_once_more(tmp_path):
    spec = {
        "suite": "suites.workloads.symbol_contenders",
        "contender": "hand",
        "samples": 64,
        "epochs": 2,
    }
    job = processes.Job(spec, ("mlp", 32, 1, "momentum"), str(tmp_path), "hung")
    started = time.perf_counter()
    processes.run_jobs([job], 1, SleepingLauncher(), quiet=True, worker_timeout=0.5)
    assert time.perf_counter() - started < 10
    assert [a["timed_out"] for a in job.attempts] == [True, True]
    assert "killed after --worker-timeout 0.5 s (hung)" in job.error
    assert job.result is None


def test_a_workers_peak_memory_is_that_of_training_not_of_making_the_data():
    """The peak is reset just before training: a larger allocation freed before the
    reset (as making the data set is) does not count in it, one after it does."""
    script = (
        "import sys; sys.path.insert(0, sys.argv[1])\n"
        "from harness import env; env.apply_thread_settings()\n"
        "from harness import workload as w\n"
        "mib = 1024\n"
        "block = bytearray(400 * 1024 * mib); block[::4096] = b'1' * len(block[::4096])\n"
        "del block\n"
        "before = w.peak_rss_kib()\n"
        "reset = w.reset_peak_rss()\n"
        "after_reset = w.peak_rss_kib()\n"
        "block = bytearray(100 * 1024 * mib); block[::4096] = b'1' * len(block[::4096])\n"
        "print(before, reset, after_reset, w.peak_rss_kib(), w.rss_kib())\n"
    )
    completed = subprocess.run(
        [sys.executable, "-c", script, BENCHMARKS], capture_output=True, text=True, timeout=120
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    before, reset, after_reset, peak, rss = completed.stdout.split()
    assert reset == "True"
    before, after_reset, peak, rss = int(before), int(after_reset), int(peak), int(rss)
    assert before >= 400 * 1024 and after_reset < before - 300 * 1024
    assert peak >= rss >= after_reset + 90 * 1024


@pytest.mark.parametrize("optimizer", ["momentum", "sgd", "adam"])
def test_training_moved_the_parameters(tmp_path, optimizer):
    """The equality of parameters the suites check is not vacuous: training changes them."""
    import mxnet as mx

    workload = importlib.import_module("harness.workload")
    contenders = importlib.import_module("suites.workloads.symbol_contenders")
    X, y = workload.make_data("mlp", 64)
    train = mx.io.NDArrayIter(X, y, batch_size=32, label_name="softmax_label")
    spec = {"model": "mlp", "batch_size": 32, "contexts": 1, "epochs": 1, "optimizer": optimizer}
    init = workload.initial_params("mlp")
    params = contenders.hand_loop(spec, train, init, workload.EpochClock())
    assert not np.allclose(params["fc1_weight"], init["fc1_weight"], atol=1e-4)


def test_module_fit_without_metric_really_computes_none():
    """The 'no metric' contender's metric is an empty CompositeEvalMetric: nothing to sync."""
    import mxnet as mx

    metric = mx.metric.CompositeEvalMetric()
    metric.update_dict({"softmax_label": mx.nd.zeros(2)}, {"softmax_output": mx.nd.zeros((2, 3))})
    assert metric.get_name_value() == []


def _player_function(log, epochs, fail_at=None, hang_at=None):
    """A contender that records when each of its epochs ran, and can fail or hang."""

    def train(spec, iterator, init, clock):
        for epoch in range(epochs):
            started = time.perf_counter()
            if epoch == fail_at:
                raise RuntimeError("broken contender")
            if epoch == hang_at:
                time.sleep(30)
            time.sleep(0.01)
            log.append((spec["contender"], epoch, started, time.perf_counter()))
            clock.tick()
        return {"w": np.ones(2)}

    return train


def _players(tmp_path, functions, epochs):
    import mxnet as mx

    turns = importlib.import_module("harness.turns")
    spec = {"batch_size": 2, "epochs": epochs, "workdir": str(tmp_path)}
    data, label = mx.nd.zeros((4, 3)), mx.nd.zeros(4)
    return {
        name: turns.Player(name, spec, data, label, {}, function)
        for name, function in functions.items()
    }


def test_contenders_in_turns_never_train_at_the_same_time(tmp_path):
    turns = importlib.import_module("harness.turns")
    log = []
    names = ["a", "b", "c"]
    players = _players(tmp_path, {n: _player_function(log, 4) for n in names}, 4)
    for player in players.values():
        player.thread.start()
    for round_index in range(4):
        for name in turns.rotation(names, round_index):
            assert players[name].play()
    for player in players.values():
        player.finish()
        assert player.error is None and player.params is not None
        assert len(player.epoch_seconds) == 4 and len(player.result()["epoch_seconds"]) == 3
        assert all(seconds >= 0.01 for seconds in player.epoch_seconds)
    spans = sorted((start, end) for _, _, start, end in log)
    assert all(end <= next_start for (_, end), (next_start, _) in zip(spans, spans[1:]))
    # the order of a round rotates, so no contender always follows the same one
    assert [name for name, *_ in log[:3]] == ["a", "b", "c"]
    assert [name for name, *_ in log[3:6]] == ["b", "c", "a"]


def test_a_contender_that_fails_or_hangs_is_reported_and_the_others_go_on(tmp_path):
    turns = importlib.import_module("harness.turns")
    log = []
    functions = {
        "steady": _player_function(log, 3),
        "broken": _player_function(log, 3, fail_at=1),
        "hung": _player_function(log, 3, hang_at=1),
    }
    players = _players(tmp_path, functions, 3)
    for player in players.values():
        player.thread.start()
    for round_index in range(3):
        for name in turns.rotation(list(functions), round_index):
            players[name].play(timeout=2.0)
    for player in players.values():
        player.finish(timeout=2.0)
    assert players["steady"].error is None and len(players["steady"].epoch_seconds) == 3
    assert "RuntimeError: broken contender" in players["broken"].error
    assert "no epoch end within 2 s (hung)" in players["hung"].error
    assert len(players["broken"].epoch_seconds) == len(players["hung"].epoch_seconds) == 1


def test_each_round_draws_its_order_so_no_contender_always_follows_the_same_one():
    """What a contender leaves behind for the next one falls on all alike: over the rounds
    each follows each other one about as often (a rotation has each follow its left
    neighbour in almost every round); the draws are fixed by the seed."""
    turns = importlib.import_module("harness.turns")
    names = ["a", "b", "c", "d"]
    follows = {}
    orders = [turns.shuffled(names, r) for r in range(400)]
    assert orders == [turns.shuffled(names, r) for r in range(400)]
    assert orders != [turns.shuffled(names, r, seed=1) for r in range(400)]
    previous = None
    for order in orders:
        assert sorted(order) == names
        for name in order:
            if previous is not None:
                follows[(previous, name)] = follows.get((previous, name), 0) + 1
            previous = name
    pairs = [(a, b) for a in names for b in names if a != b]
    assert all(follows.get(pair, 0) > 0.6 * 1600 / 12 for pair in pairs), follows


def test_each_pair_of_timed_rounds_gives_every_contender_each_position_alike():
    """Rounds 1 and 2, 3 and 4, ... run one order and its reverse: with two contenders each
    is first in exactly half of the timed rounds of a process, whatever its seed; with
    more, each contender's two positions in a pair sum to n - 1."""
    turns = importlib.import_module("harness.turns")
    for seed in range(6):
        firsts = [turns.shuffled(["a", "b"], r, seed)[0] for r in range(1, 9)]
        assert firsts.count("a") == firsts.count("b") == 4
        names = ["a", "b", "c", "d", "e"]
        for first in range(1, 41, 2):
            one, two = (turns.shuffled(names, r, seed) for r in (first, first + 1))
            assert two == one[::-1]
            assert {one.index(n) + two.index(n) for n in names} == {len(names) - 1}
        assert turns.shuffled(names, 1, seed) != turns.shuffled(names, 3, seed)


# ------------------------------------------------------------- the suites of run.py
CHECKED_BY = {  # each suite run.py names -> the test module that runs its --check
    **dict.fromkeys(("loop", "micro", "updaters", "head", "prefetch"), "test_suites.py"),
    **dict.fromkeys(("evaluate", "sweep", "startup", "scaling", "precision"), "test_suites.py"),
    "gluon": "test_gluon_suite.py",
    "buckets": "test_buckets_suite.py",
    "serving": "test_serving_suite.py",
}
LINE_BOUND = 4000  # lines of Python code under benchmarks/ (issue 36)


def test_every_suite_of_run_py_runs_its_check_in_a_test():
    """The contest suite by its workloads' names (loop, gluon, buckets), every other suite
    by its own: each one's ``--check`` runs in a test of this folder."""
    run = importlib.import_module("run")
    assert run.ALIASES == {"loop": "symbol", "gluon": "gluon", "buckets": "buckets"}
    assert set(run.ALIASES.values()) == set(importlib.import_module("suites.contest").WORKLOADS)
    assert (set(run.SUITES) - {"contest"}) | set(run.ALIASES) == set(CHECKED_BY)
    here = os.path.dirname(__file__)
    for suite, module in CHECKED_BY.items():
        with open(os.path.join(here, module)) as f:
            text = f.read()
        assert f'check("{suite}"' in text or f'"{suite}", "--check"' in text, suite


def python_code_lines() -> int:
    """Lines of code under benchmarks/: as the module check counts them, without docstrings,
    comments or blank lines (size checks count code, not documentation)."""
    lines = 0
    for folder, _, files in os.walk(BENCHMARKS):
        for name in files:
            if name.endswith(".py"):
                with open(os.path.join(folder, name)) as f:
                    lines += code_lines(f.read())
    return lines


def test_benchmarks_hold_at_most_4000_lines_of_python_code():
    assert python_code_lines() <= LINE_BOUND
