"""The buckets suite runs end to end (``python benchmarks/run.py buckets --check``): every
contender trains an LSTM over six buckets on one and two contexts and ends with finite
parameters equal to the hand-written bucketing loop's; mxoid's memory over six buckets
and over one bucket of the longest length is measured.

Only correctness is asserted here; speed and memory live in the suite's output.
"""

import importlib
import json
import os
import subprocess
import sys

import pytest

BENCHMARKS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(__file__))), "benchmarks")
RUN = os.path.join(BENCHMARKS, "run.py")
sys.path.insert(0, BENCHMARKS)
contest = importlib.import_module("harness.contest")
buckets_suite = importlib.import_module("suites.workloads.buckets")
targets = importlib.import_module("harness.targets")
contest_suite = importlib.import_module("suites.contest")


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """``run.py buckets --check``: every contender on tiny epochs (a batch of each
    bucket), a small LSTM on one and two contexts, in turns; then the memory pass."""
    path = tmp_path_factory.mktemp("buckets") / "buckets.json"
    command = [sys.executable, RUN, "buckets", "--check", "--json", str(path), "--quiet"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    data = json.loads(path.read_text())
    assert (data["suite"], data["mode"]) == ("buckets", "check")
    return data, done.stdout


def cell_of(row):
    return contest.cell_of(row, buckets_suite.CELL_KEYS)


def test_every_contender_ran_in_every_cell(report):
    data, _ = report
    cells = {tuple(cell) for cell in data["settings"]["cells"]}
    assert {contexts for *_, contexts in cells} == {1, 2}
    ran = {(r["contender"],) + cell_of(r) for r in data["results"]}
    assert ran == {(c,) + cell for c in buckets_suite.ALL_CONTENDERS for cell in cells}
    assert data["settings"]["buckets"] == [10, 20, 30, 40, 50, 60]
    for row in data["results"]:
        assert not row["errors"], row["errors"]
        assert row["interleaved"] is True
        assert row["samples_per_second"]["median"] > 0
        # every sentence trains: as many batches as sentences over the batch size
        assert row["batches_per_epoch"] * row["batch_size"] == row["samples_per_epoch"]
        assert row["batches_per_epoch"] % len(buckets_suite.BUCKETS) == 0
        per_sentence = row["tokens_per_epoch"] / row["samples_per_epoch"]
        assert 3 < per_sentence < 60
        rate = row["tokens_per_second"]["median"]
        assert rate == pytest.approx(row["samples_per_second"]["median"] * per_sentence)


def test_every_contender_ends_with_finite_parameters_equal_to_the_floors(report):
    data, stdout = report
    assert data["correctness"]["ok"], data["correctness"]["failures"]
    assert data["correctness"]["reference"] == "hand"
    assert all(row["finite"] for row in data["results"])
    checked = [r for r in data["results"] if r["contender"] != "hand"]
    expected = set(buckets_suite.ALL_CONTENDERS) - {"hand"}
    assert {r["contender"] for r in checked} == expected
    for row in checked:
        assert row["expected_equal_to_hand"] and row["equal_to_hand"], row
        assert row["rtol"] == 1e-5 and row["max_abs_diff_to_hand"] <= 1e-5, row
    assert "Correctness: every contender finite and ends with the floor's parameters" in stdout


def test_targets_of_every_cell_carry_their_interval(report):
    """The run's rows give issue 29's targets (computed here, since --check prints none)."""
    data, _ = report
    found = {e["target"]: e for e in buckets_suite.targets(data["results"])}
    for cell in data["settings"]["cells"]:
        where = buckets_suite.describe_cell(tuple(cell))
        floor = found[f"mxoid_everyday over hand, {where}: >= 0.95x"]
        fit = found[f"mxoid_everyday over bucketing_fit_metric, {where}: >= 1.30x"]
        assert floor["is_target"] and fit["is_target"] and fit["floor"] > 0
        assert not found[f"mxoid_bare over hand, {where}"]["is_target"]
    assert len(found) == len(buckets_suite.RATIOS) * len(data["settings"]["cells"])
    for entry in found.values():
        low, high = entry["interval"]
        assert 0 < low <= high and entry["met"] == (entry["measured"] >= entry["limit"])
    table = targets.table(list(found.values()))
    assert "(comparison)" in table and "(90%: " in table


def test_memory_over_six_buckets_and_one_is_measured(report):
    """mxoid (everyday) and the floor, each alone, over six buckets and over one of 60."""
    data, stdout = report
    memory = data["bucket_memory"]
    cells = {tuple(cell) for cell in data["settings"]["memory_cells"]}
    assert cells == {tuple(data["settings"]["cells"][0])}  # --check: the first cell's only
    measured = {(tuple(e["cell"]), e["contender"], len(e["buckets"])) for e in memory}
    assert measured == {
        (cell, contender, n)
        for cell in cells
        for contender in ("mxoid_everyday", "hand")
        for n in (1, 6)
    }
    for entry in memory:
        assert entry["error"] is None and entry["finite"]
        assert entry["peak_rss_mib"] >= entry["peak_over_start_mib"] > 0
    found = [e for e in data["targets"] if e["target"].startswith("peak memory")]
    assert len(found) == 3 * len(cells)  # mxoid's training and whole process, the floor's
    for entry in found:
        assert entry["measured"] > 0 and entry["met"] == (entry["measured"] <= 1.3)
    targets = [e for e in found if e["is_target"]]
    assert len(targets) == len(cells)
    assert all(e["target"].startswith("peak memory of mxoid_everyday") for e in targets)
    assert "6 buckets over 1 bucket of 60, training's" in stdout


def test_the_report_renders_as_markdown(report):
    data, _ = report
    text = contest_suite.markdown(data, buckets_suite)
    assert "hand loop over buckets (floor)" in text and "| ref " in text and "tokens/s" in text
    assert text.count("| equal ") == len(data["results"]) - len(data["settings"]["cells"])


def test_the_sentences_fill_every_bucket_alike_and_cells_are_checked():
    rows, lengths = buckets_suite.make_sentences(6 * 32, "lstm")
    assert rows.shape == (192, 60) and lengths.min() >= 3 and lengths.max() <= 60
    counts = [
        ((lengths > low) & (lengths <= high)).sum()
        for low, high in zip((0, 10, 20, 30, 40, 50), buckets_suite.BUCKETS)
    ]
    assert counts == [32] * 6
    assert ((rows > 0).sum(axis=1) == lengths).all()  # words, then padding
    assert buckets_suite.parse_cells("lstm-32-1,lstm2-16-2") == (("lstm", 32, 1), ("lstm2", 16, 2))
    with pytest.raises(ValueError, match="unknown model"):
        buckets_suite.parse_cells("gru-32-1")
