"""Every suite runs end to end (``python benchmarks/run.py SUITE --check``), and its
contenders compute what they must: the loop suite's what the hand-written loop computes.

Only correctness is asserted here; speed lives in the suites' output.
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
loop = importlib.import_module("suites.workloads.symbol")  # the symbol workload
targets = importlib.import_module("harness.targets")


def run_suite(*arguments, timeout=600):
    return subprocess.run(
        [sys.executable, RUN, *arguments], capture_output=True, text=True, timeout=timeout
    )


def check(suite, tmp_path, *more):
    """Run ``benchmarks/run.py SUITE --check``; return its JSON report and output."""
    path = tmp_path / f"{suite}.json"
    done = run_suite(suite, "--check", "--json", str(path), *more)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    data = json.loads(path.read_text())
    assert data["suite"] == suite and data["mode"] == "check"
    assert data["correctness"]["ok"], data["correctness"]["failures"]
    return data, done.stdout


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """The loop suite's check: every contender on tiny epochs, one and two contexts, three
    optimizers, in turns and then alone for memory, and the micro suite's check."""
    return check("loop", tmp_path_factory.mktemp("loop"), "--quiet")


def cell_of(row):
    return contest.cell_of(row, loop.CELL_KEYS)


# ------------------------------------------------------------------------ the loop suite
def test_every_contender_ran_in_every_cell(report):
    data, _ = report
    cells = {tuple(cell) for cell in data["settings"]["cells"]}
    assert {contexts for _, _, contexts, _ in cells} == {1, 2}
    assert {optimizer for *_, optimizer in cells} == {"momentum", "sgd", "adam"}
    ran = {(r["contender"],) + cell_of(r) for r in data["results"]}
    assert ran == {(c,) + cell for c in loop.ALL_CONTENDERS for cell in cells}
    for row in data["results"]:
        assert not row["errors"], row["errors"]
        assert row["samples_per_second"]["median"] > 0


def test_every_contender_ends_with_finite_parameters(report):
    data, _ = report
    assert all(row["finite"] for row in data["results"])


def test_same_computation_ends_with_the_hand_loops_parameters(report):
    data, stdout = report
    assert data["correctness"]["ok"], data["correctness"]["failures"]
    checked = [row for row in data["results"] if row["contender"] in loop.EQUAL_TO_HAND]
    expected = set(loop.EQUAL_TO_HAND) - set(loop.EXTRA_CONTENDERS)
    assert {row["contender"] for row in checked} == expected
    for row in checked:
        assert row["equal_to_hand"], row
        assert row["max_abs_diff_to_hand"] <= 1e-5, row
    assert "Correctness: every contender finite" in stdout


def test_the_check_trains_a_cells_contenders_in_turns_and_takes_memory_apart(report):
    """Throughput comes from one process per cell (the contenders an epoch each in
    turn), memory from a process per contender: both passes ran, and the rows carry
    the rounds of each process and the peaks of the memory pass."""
    data, stdout = report
    assert data["settings"]["design"] == "interleaved"
    assert data["settings"]["memory_pass"] is True
    for row in data["results"]:
        assert row["interleaved"] is True
        assert [len(run) for run in row["epoch_seconds"]] == [data["settings"]["timed_epochs"]]
        assert row["peak_rss_mib"] > 0 and row["memory_from"].startswith("a process of its own")
    assert "in turns: 1 process(es) of 2 rounds" in stdout


def test_rows_of_the_check_carry_their_host_time_per_round(report):
    data, _ = report
    for row in data["results"]:
        host = row["epoch_host_seconds"]
        assert [len(run) for run in host] == [len(run) for run in row["epoch_seconds"]]
        assert all(seconds > 0 for run in host for seconds in run)


def test_targets_of_every_optimizer_cell(report):
    """Issue 13's targets are computed for each MLP cell and optimizer the run has."""
    data, _ = report
    found = {entry["target"]: entry for entry in loop.targets(data["results"], None)}
    for where in ("MLP b32 1 ctx", "MLP b32 1 ctx, SGD", "MLP b32 2 ctx, Adam"):
        for target in (
            f"mxoid everyday extensions, {where}: >= 95% of hand",
            f"mxoid bare, {where}: >= 98% of hand",
            f"mxoid everyday extensions, {where}: Python thread's host time per batch "
            "<= 1.10x hand's",
            f"mxoid bare, {where}: Python thread's host time per batch <= 1.05x hand's",
            f"mxoid everyday extensions, {where}: >= 1.5x Module.fit, accuracy",
            f"mxoid bare, {where}: ahead of the Gluon loop (x Gluon >= 1.00x)",
        ):
            entry = found[target]
            assert entry["met"] == (
                entry["measured"] <= entry["limit"]
                if "<=" in target
                else entry["measured"] >= entry["limit"]
            )
    assert targets.format_measured(found[target]).split(" (90%")[0].endswith("x")


def test_targets_on_throughput_ratios_report_their_interval(report):
    data, _ = report
    found = loop.targets(data["results"], None)
    ratios = [e for e in found if "of hand" in e["target"] or "Gluon" in e["target"]]
    assert ratios and all("interval" in e for e in ratios)
    for entry in ratios:
        low, high = entry["interval"]
        assert low <= high and entry["within_noise"] == (low <= entry["limit"] <= high)
        assert "(90%: " in targets.format_measured(entry)


def test_targets_against_module_fit_carry_the_hand_loops_own_ratio(report):
    data, _ = report
    rows = data["results"]
    index = {(r["contender"],) + cell_of(r): r for r in rows}
    found = [e for e in loop.targets(rows, None) if "1.5x Module.fit" in e["target"]]
    assert found
    for entry in found:
        cell = next(
            cell_of(r)
            for r in rows
            if entry["target"].endswith(
                f"{loop.describe_cell(cell_of(r))}: >= 1.5x Module.fit, accuracy"
            )
        )
        hand, module = index[("hand", *cell)], index[("module_fit_acc", *cell)]
        assert entry["floor"] == contest.throughput_ratio(hand, module)[0]


# ---------------------------------------------------------------------- the micro suite
def test_micro_benchmark_reports_dispatch_and_per_batch_costs(report):
    data, _ = report
    micro = data["micro"]
    assert micro is not None
    assert {entry["extensions"] for entry in micro["dispatch"]} == {10, 50}
    assert all(entry["us_per_extension"] > 0 for entry in micro["dispatch"])
    assert micro["per_batch"] and micro["per_batch"][0]["name"].startswith("bare")


def test_each_everyday_extension_is_held_to_10_us_per_batch_with_its_interval(report):
    data, _ = report
    entries = [
        e
        for e in data["micro"]["per_batch"]
        if e["name"].startswith("+ ") and e["name"] != "+ all everyday"
    ]
    assert entries  # the check measures TrainingMonitoring
    found = {
        t["target"]: t
        for t in loop.targets(data["results"], data["micro"])
        if t["target"].startswith("micro, ")
    }
    assert len(found) == len(entries)
    for entry in entries:
        low, high = entry["us_per_batch_interval"]
        assert low <= entry["us_per_batch"] <= high
        (target,) = [
            t for name, t in found.items() if entry["name"][2:] in name and entry["cell"] in name
        ]
        assert target["unit"] == "us" and target["limit"] == 10.0
        assert target["measured"] == entry["us_per_batch"]
        assert target["met"] == (entry["us_per_batch"] <= 10.0)
        assert target["within_noise"] == (low <= 10.0 <= high)
        assert targets.format_measured(target) == (
            f"{target['measured']:.2f} us (90%: {low:.1f} to {high:.1f} us)"
        )


def test_the_micro_benchmark_measures_one_extension_on_the_contexts_asked(tmp_path):
    """``--contexts 2 --variants TrainingMonitoring``: the bare loop and that extension on
    two contexts only, over the rounds asked, without the dispatch measurement."""
    more = ["--contexts", "2", "--variants", "TrainingMonitoring", "--rounds", "3", "--no-dispatch"]
    data, _ = check("micro", tmp_path, *more)
    assert data["dispatch"] == []
    rows = [(entry["name"], entry["cell"]) for entry in data["per_batch"]]
    assert rows == [
        ("bare MainLoop (FinishAfter only)", "MLP b32 2 ctx"),
        ("+ TrainingMonitoring", "MLP b32 2 ctx"),
    ]
    unknown = run_suite("micro", "--check", "--variants", "Nope", "--no-dispatch")
    assert unknown.returncode != 0 and "unknown variants ['Nope']" in unknown.stderr


# ------------------------------------------------------------------- the other suites
def test_updaters_check_fused_agrees_with_stock(tmp_path):
    data, _ = check("updaters", tmp_path)
    cases = data["correctness"]["cases"]
    assert {c["optimizer"] for c in cases} == {"sgd", "sgd_mom", "nag", "adam"}
    assert all(not c["failures"] for c in cases)
    assert all(
        r["stock"]["us_per_step"] > 0 and r["fused"]["us_per_step"] > 0 for r in data["results"]
    )


def test_head_check_the_fused_and_mxnets_heads_agree_bit_for_bit(tmp_path):
    data, _ = check("head", tmp_path)
    variants = {(r["model"], r["batch"], r["contexts"], r["variant"]) for r in data["results"]}
    assert variants == {
        ("mlp", 32, contexts, variant)
        for contexts in (1, 2)
        for variant in ("no head", "MXNet's operators", "fused, backward sums", "fused operator")
    }
    assert all(r["us_per_batch"] > 0 and r["cpu_us_per_batch"] > 0 for r in data["results"])


def test_prefetch_check_same_parameters_with_and_without(tmp_path):
    check("prefetch", tmp_path)


def test_evaluate_check_same_accuracy_as_module_score(tmp_path):
    data, _ = check("evaluate", tmp_path)
    for row in data["results"]:
        if "acc" in row["metrics"]:
            assert row["values"]["mxoid"]["acc"] == row["values"]["module"]["acc"]
            assert 0.0 < row["values"]["mxoid"]["acc"] < 1.0  # the equality is not vacuous


def test_sweep_check_mxoid_ends_with_the_hand_loops_parameters(tmp_path):
    data, _ = check("sweep", tmp_path)
    assert {(r["network"], r["arrays"], r["contexts"]) for r in data["results"]} == {
        ("deep_narrow", 10, 1),
        ("deep_narrow", 50, 1),
        ("resnet56", 173, 1),
        ("deep_narrow", 10, 2),
        ("deep_narrow", 50, 2),
        ("resnet56", 173, 2),
    }


def test_the_latest_full_run_renders_as_markdown():
    """``--report``: the README's table from the kept results, without running anything."""
    done = run_suite("loop", "--report", os.path.join(BENCHMARKS, "results", "loop.json"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "| MLP b32 1 ctx" in done.stdout and "mxoid everyday extensions" in done.stdout
    assert "| target " in done.stdout


def test_startup_check_every_contender_from_scratch_trains_as_module_fit(tmp_path):
    """Fresh processes: MainLoop (everyday extensions, bare, and on a machine whose cache
    lacks the fused operator) ends its first epoch with Module.fit's parameters, and so
    does Module importing MXNet without the operator cache; the first run announced the
    operator's build; every target is computed in the cell."""
    data, stdout = check("startup", tmp_path)
    (row,) = data["results"]
    for name in ("module", "mxoid", "mxoid bare", "mxoid, first run", "module, no operator cache"):
        assert row[name]["construct"] > 0 and row[name]["first_epoch"] > 0
        assert row[name]["import_mxnet"] > row[name]["construct"]
        assert row[name]["construct_cpu"] > 0 and row[name]["first_epoch_cpu"] > 0
        cpu = row[name]["construct_cpu"] + row[name]["first_epoch_cpu"]
        assert row[name]["from_scratch_cpu"] == cpu
    assert row["mxoid, first run"]["announced_build"] == [True]
    assert [t["target"] for t in data["targets"]] == [
        "MainLoop(...), mlp 1 ctx: <= Module's",
        "MainLoop(...) + one epoch, everyday extensions, mlp 1 ctx: <= Module's",
        "MainLoop(...), CPU time, mlp 1 ctx: <= Module's",
        "MainLoop(...) + one epoch, everyday, CPU time, mlp 1 ctx: <= Module's",
        "import mxnet, operator functions cached, mlp 1 ctx: <= 0.75 x",
    ]
    assert "| mlp   |   1 | mxoid, first run " in stdout
    assert "| mlp   |   1 | module, no operator cache |" in stdout


def test_scaling_check_launches_one_and_two_workers_on_loopback(tmp_path):
    """``mxoid launch`` of 1 and 2 workers and a server: every step timed in its three
    parts, and the bytes each worker pushes and pulls counted from its arrays."""
    data, stdout = check("scaling", tmp_path)
    cells = {(c["model"], c["workers"], c["servers"]) for c in data["results"]}
    assert cells == {("mlp", 1, 1), ("mlp", 2, 1)}
    for cell in data["results"]:
        assert cell["step"] > 0 and min(cell["compute"], cell["pushpull"]) > 0
        assert cell["bytes_per_worker"] == 2 * 4 * cell["params"]
    assert "| model | workers | servers | step ms |" in stdout


def test_scaling_saves_time_a_checkpoint_without_and_with_the_servers_states(tmp_path):
    """``--saves``: rank 0's save timed both ways; the servers' Adam states (two per
    parameter) make the checkpoint about three times the parameters (issue 39, item 1)."""
    data, stdout = check("scaling", tmp_path, "--workers", "2", "--saves", "2")
    (cell,) = data["results"]
    save = cell["save"]
    assert save["without"] > 0 and save["with"] > 0
    assert save["states_bytes"] > 2 * 4 * cell["params"]
    more = save["with_bytes"] - save["without_bytes"]  # the file, and its manifest entry
    assert save["states_bytes"] < more < save["states_bytes"] + 1000
    assert "| model | workers | servers | save ms | with server states ms |" in stdout


def test_precision_check_bfloat16_lenet_trains_as_module_fit_of_amps_symbol(tmp_path):
    """LeNet in turns, float32 and bfloat16: mxoid's bfloat16 parameters equal Module.fit of
    AMP's converted symbol, both loops' are float32, the bfloat16 graph holds amp_cast; a
    ratio with its interval and an accuracy for each."""
    from mxoid.precision import bfloat16_support

    missing = bfloat16_support()
    if missing is not None:
        pytest.skip(f"this CPU does not compute bfloat16 in MXNet's MKLDNN ({missing})")
    data, stdout = check("precision", tmp_path)
    (row,) = data["results"]
    assert row["model"] == "lenet" and row["equal_to_module_fit_amp"] is True
    low, high = row["speed_ratio_interval"]
    assert row["speed_ratio"] > 0 and low <= row["speed_ratio"] <= high
    for precision in ("float32", "bfloat16"):
        assert row[precision]["float32"] and 0 <= row[precision]["accuracy"] <= 1
    assert row["bfloat16"]["amp_cast"] and not row["float32"]["amp_cast"]
    assert "| lenet |" in stdout and "speed bf16 / fp32 (90%)" in stdout
