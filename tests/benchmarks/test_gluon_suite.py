"""The gluon suite runs end to end (``python benchmarks/run.py gluon --check``): every
contender trains on every cell it belongs to, ends with finite parameters equal to the
hand-written Gluon loop's (in the jitter cell, where the loaders augment their samples at
random: mxoid's with no worker and with two equal to each other), and mxoid's
``Evaluate`` equals the estimator's validation metrics.

Only correctness is asserted here; speed lives in the suite's output.
"""

import importlib
import json
import os
import subprocess
import sys

import pytest
from conftest import full_environment

BENCHMARKS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(__file__))), "benchmarks")
RUN = os.path.join(BENCHMARKS, "run.py")
sys.path.insert(0, BENCHMARKS)
contest = importlib.import_module("harness.contest")
env = importlib.import_module("harness.env")
gluon_suite = importlib.import_module("suites.workloads.gluon")
targets = importlib.import_module("harness.targets")
contest_suite = importlib.import_module("suites.contest")


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """``run.py gluon --check``: every contender on tiny epochs, MLP b32 on one and two
    contexts and LeNet b32 on two, the DataLoader contenders on the digits with a jitter,
    the in-memory ones on the model zoo's ResNet-18 (batch 4, two contexts), in turns
    (about 30 s on two shared vCPUs)."""
    path = tmp_path_factory.mktemp("gluon") / "gluon.json"
    done = subprocess.run(
        [sys.executable, RUN, "gluon", "--check", "--json", str(path), "--quiet"],
        env=full_environment(),  # its workers load the digits with scikit-learn
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    data = json.loads(path.read_text())
    assert data["suite"] == "gluon" and data["mode"] == "check"
    return data, done.stdout


def cell_of(row):
    return contest.cell_of(row, gluon_suite.CELL_KEYS)


def expected_contenders():
    if gluon_suite.has_data_loader_iter(env.ROOT):
        return set(gluon_suite.ALL_CONTENDERS)
    return set(gluon_suite.ALL_CONTENDERS) - set(gluon_suite.LOADER_CONTENDERS)


def cell_contenders(cell):
    """The contenders of a cell: all but in the jitter cell (the reference and the DataLoader
    ones) and the ResNet-18 cell (the in-memory loops and mxoid)."""
    if cell[0] == "jitter":
        return {"gluon_hybrid"} | (expected_contenders() & set(gluon_suite.LOADER_CONTENDERS))
    if cell[0] == "resnet18":
        return {"gluon_hybrid", "gluon_hybrid_acc", "mxoid_gluon", "mxoid_gluon_bare"}
    return expected_contenders()


def test_every_contender_ran_in_every_cell(report):
    data, _ = report
    cells = {tuple(cell) for cell in data["settings"]["cells"]}
    assert {contexts for *_, contexts in cells} == {1, 2}
    assert {model for model, *_ in cells} == {"mlp", "lenet", "jitter", "resnet18"}
    ran = {(r["contender"],) + cell_of(r) for r in data["results"]}
    assert ran == {(c,) + cell for cell in cells for c in cell_contenders(cell)}
    assert set(data["settings"]["contenders"]) == expected_contenders()
    for row in data["results"]:
        assert not row["errors"], row["errors"]
        assert row["samples_per_second"]["median"] > 0
        assert row["interleaved"] is True


def test_every_contender_ends_with_finite_parameters_equal_to_the_gluon_loops(report):
    data, stdout = report
    assert data["correctness"]["ok"], data["correctness"]["failures"]
    assert data["correctness"]["reference"] == gluon_suite.REFERENCE == "gluon_hybrid"
    assert all(row["finite"] for row in data["results"])
    checked = [r for r in data["results"] if r["contender"] != gluon_suite.REFERENCE]
    assert {r["contender"] for r in checked} == expected_contenders() - {"gluon_hybrid"}
    for row in checked:
        if row["model"] == "jitter":  # a random augmentation the reference does not have
            assert not row["expected_equal_to_reference"] and not row["equal_to_reference"]
            continue
        assert row["expected_equal_to_reference"] and row["equal_to_reference"], row
        assert row["rtol"] == 1e-5 and row["max_abs_diff_to_reference"] <= 1e-5, row
    assert "Correctness: every contender finite and ends with the reference's" in stdout


def test_mxoid_trains_the_same_jittered_samples_with_and_without_workers(report):
    """In the jitter cell mxoid fed by the DataLoader with no worker and with two ends with
    the same parameters (the same augmentation, seeded by mxoid, whoever loads a batch)."""
    data, stdout = report
    if not gluon_suite.has_data_loader_iter(env.ROOT):
        pytest.skip("this checkout's mxoid has no DataLoaderIter")
    augmentation = data["correctness"]["augmentation"]
    assert augmentation["ok"], augmentation["failures"]
    assert [entry["cell"] for entry in augmentation["compared"]] == [["jitter", 32, 1]]
    assert all(entry["equal"] for entry in augmentation["compared"])
    rows = {r["contender"]: r for r in data["results"] if r["model"] == "jitter"}
    assert rows["mxoid_gluon_loader"]["max_abs_diff_to_reference"] > 1e-3  # it was jittered
    assert "in the jitter cell mxoid ends alike with and without workers" in stdout


def test_mxoids_evaluate_equals_the_estimators_validation_metrics(report):
    """On every cell and epoch both counted the same 200 samples (a short last batch:
    padded for mxoid, kept by the estimator's DataLoader), with the same accuracy and
    the loss within rtol 1e-5."""
    data, stdout = report
    validation = data["correctness"]["validation"]
    assert validation["ok"], validation["failures"]
    epochs = validation["epochs"]
    cells = {tuple(cell) for cell in data["settings"]["cells"] if cell[0] in ("mlp", "lenet")}
    assert {tuple(e["cell"]) for e in epochs} == cells
    assert len(epochs) == len(cells) * (1 + data["settings"]["timed_epochs"])
    for entry in epochs:
        assert entry["equal"]
        assert entry["mxoid"]["samples"] == entry["estimator"]["samples"] == 200
        assert entry["mxoid"]["accuracy"] == entry["estimator"]["accuracy"]
        assert entry["loss_relative_difference"] <= 1e-5
    assert "mxoid's Evaluate equals the estimator's val_metrics" in stdout


def test_targets_and_comparisons_of_every_cell_carry_their_interval(report):
    """The run's rows give issue 30's targets (computed here, since --check prints none)."""
    data, _ = report
    found = {e["target"]: e for e in gluon_suite.targets(data["results"])}
    for where in ("MLP b32 1 ctx", "MLP b32 2 ctx"):
        for text in (
            f"mxoid_gluon over gluon_hybrid_acc, {where}: >= 1.50x",
            f"mxoid_gluon over gluon_hybrid, {where}: >= 1.00x",
            f"mxoid_gluon over estimator, {where}: >= 1.00x",
        ):
            assert found[text]["is_target"]
    assert "mxoid_gluon over gluon_hybrid_acc, LeNet b32 2 ctx: >= 1.50x" not in found
    for workers in ("", "_w2"):  # issue 38's: on the MLP and the jitter cell, not LeNet
        loader = f"mxoid_gluon_loader{workers} over gluon_hybrid_acc_loader{workers}"
        assert found[f"{loader}, MLP b32 1 ctx: >= 1.20x"]["is_target"]
        assert found[f"{loader}, digits MLP, jitter b32 1 ctx: >= 1.20x"]["is_target"]
        assert not found[f"{loader}, LeNet b32 2 ctx"]["is_target"]
    assert found["mxoid_gluon over gluon_hybrid, ResNet-18 b4 2 ctx: >= 1.00x"]["is_target"]
    assert found["mxoid_gluon over gluon_hybrid, LeNet b32 2 ctx: >= 1.00x"]["is_target"]
    assert not found["mxoid_gluon_bare over gluon_hybrid, LeNet b32 2 ctx"]["is_target"]
    for entry in found.values():
        low, high = entry["interval"]
        assert low <= high and entry["met"] == (entry["measured"] >= entry["limit"])
    table = targets.table(list(found.values()))
    assert "(comparison)" in table and "(90%: " in table


def test_the_report_renders_as_markdown(report):
    data, _ = report
    text = contest_suite.markdown(data, gluon_suite)
    assert "Gluon hybridized, no metric (reference)" in text and "| ref " in text
    jittered = sum(r["model"] == "jitter" for r in data["results"]) - 1  # the reference's not
    expected = len(data["results"]) - len(data["settings"]["cells"]) - jittered
    assert text.count("| equal ") == expected


def test_cells_are_parsed_and_bad_ones_refused():
    assert gluon_suite.parse_cells("mlp-32-1,lenet-128-2") == (("mlp", 32, 1), ("lenet", 128, 2))
    with pytest.raises(ValueError, match="unknown model"):
        gluon_suite.parse_cells("resnet-32-1")
    assert gluon_suite.parse_cells("jitter-32-1,resnet18-32-2") == (
        ("jitter", 32, 1),
        ("resnet18", 32, 2),
    )
