"""The gluon workload (``run.py gluon``): mxoid training a Gluon HybridBlock against Gluon's loops.

The contenders (:mod:`suites.workloads.gluon_contenders`) train the same Gluon network
from the same values on the same data with the same optimizer: a hand-written
hybridized Gluon loop (the reference, ``gluon_hybrid``), the same with an accuracy
metric updated every batch, ``mxoid.MainLoop(net, ...)`` with the everyday extensions
and bare, Gluon's ``Estimator``, and the hand loop and mxoid fed by one ``DataLoader``
(no worker, two workers). A cell's contenders train in turns in one worker process
(:mod:`harness.contest`); all must end with the reference's parameters. ``--check``
also compares mxoid's ``Evaluate`` with the estimator's validation metrics. Exit
status 1: a worker failed, non-finite parameters, other parameters than the
reference's, or other validation numbers than the estimator's; speed never changes it.
"""

import glob
import json
import os
from typing import Dict, List

from harness import contest
from harness.stats import paired_time_ratio
from harness.targets import ratios

NAME = "gluon"  # the results' name and run.py's alias
REFERENCE = "gluon_hybrid"
LOADER_CONTENDERS = tuple(
    f"{name}{suffix}"
    for suffix in ("", "_w2")
    for name in ("gluon_hybrid_loader", "gluon_hybrid_acc_loader", "mxoid_gluon_loader")
)
ALL_CONTENDERS = tuple(
    "gluon_hybrid gluon_hybrid_acc mxoid_gluon mxoid_gluon_bare estimator".split()
) + tuple(LOADER_CONTENDERS)
LABELS = {
    REFERENCE: "Gluon hybridized, no metric (reference)",
    "gluon_hybrid_acc": "Gluon hybridized, accuracy",
    "mxoid_gluon": "mxoid everyday extensions",
    "mxoid_gluon_bare": "mxoid bare",
    "estimator": "Gluon Estimator, DataLoader",
    "gluon_hybrid_loader": "Gluon hybridized, DataLoader",
    "mxoid_gluon_loader": "mxoid everyday, DataLoader",
    "gluon_hybrid_acc_loader": "Gluon hybridized, accuracy, DataLoader",
    "gluon_hybrid_loader_w2": "Gluon hybridized, DataLoader 2 workers",
    "gluon_hybrid_acc_loader_w2": "Gluon hybridized, accuracy, DataLoader 2 workers",
    "mxoid_gluon_loader_w2": "mxoid everyday, DataLoader 2 workers",
}
# Every contender computes what the reference computes: the same graph, the same
# optimizer steps, the same data in the same order (see suites.workloads.gluon_contenders).
EQUAL_TO_REFERENCE = tuple(c for c in ALL_CONTENDERS if c != REFERENCE)
RTOL, ATOL = contest.RTOL, contest.ATOL
VALIDATION_RTOL = 1e-5  # the validation loss: the same network evaluated, summed otherwise
VALIDATE_ENV = "GLUON_SUITE_VALIDATE"  # see suites.workloads.gluon_contenders


def parse_cells(text: str) -> tuple:
    """``mlp-32-1,lenet-128-2`` -> cells ``(model, batch size, contexts)``."""
    cells = []
    for item in text.split(","):
        model, batch, contexts = item.split("-")
        if model not in ("mlp", "lenet"):
            raise ValueError(f"cell {item!r}: unknown model {model!r}; use mlp or lenet")
        cells.append((model, int(batch), int(contexts)))
    return tuple(cells)


MODES = {  # timed: rounds a process; repeat: processes a cell; memory: its pass's timed epochs
    "full": dict(timed=8, repeat=3, memory=1, parallel=1),
    "quick": dict(timed=6, repeat=1, memory=0, parallel=1),
    "check": dict(timed=2, repeat=1, memory=0, parallel=2),
}
CELLS = {
    "full": parse_cells("mlp-32-1,mlp-32-2,mlp-128-1,mlp-128-2,lenet-128-1,lenet-128-2"),
    "quick": parse_cells("mlp-32-1,mlp-32-2"),
    "check": parse_cells("mlp-32-1,mlp-32-2,lenet-32-2"),
}
SAMPLES = {  # samples an epoch, by model
    "full": {"mlp": 8192, "lenet": 1024},
    "quick": {"mlp": 4096, "lenet": 512},
    "check": {"mlp": 256, "lenet": 224},
}


def describe_cell(cell: tuple) -> str:
    model, batch, contexts = cell
    return f"{'MLP' if model == 'mlp' else 'LeNet'} b{batch} {contexts} ctx"


CELL_KEYS = ("model", "batch_size", "contexts")
CONTEST = contest.Contest("suites.workloads.gluon_contenders", LABELS, describe_cell, CELL_KEYS)
CONTEST.equal_to_hand, CONTEST.versus = EQUAL_TO_REFERENCE, "gluon_hybrid_acc"
CONTEST.reference, CONTEST.key, CONTEST.versus_key = REFERENCE, "reference", "gluon_hybrid_acc"
CONTEST.headers, CONTEST.reference_text = ("x gluon", "x gluon acc"), "the reference"


# -------------------------------------------------------------------- validation
def collect_validation(root: str) -> Dict[tuple, Dict[str, dict]]:
    """``{(cell, repeat): {contender: validation.json}}`` of the throughput pass (the
    latest attempt of each worker)."""
    found: Dict[tuple, Dict[str, dict]] = {}
    pattern = os.path.join(root, "*", "attempt*", "*", "validation.json")
    for path in sorted(glob.glob(pattern)):  # attempt0 before attempt1: the last one wins
        with open(path) as f:
            data = json.load(f)
        cell = tuple(data[k] for k in CELL_KEYS)
        found.setdefault((cell, data.get("repeat", 0)), {})[data["contender"]] = data
    return found


def compare_validation(found: Dict[tuple, Dict[str, dict]], cells) -> dict:
    """mxoid's ``Evaluate`` against the estimator's ``val_metrics``, epoch by epoch: the
    same samples counted, the same accuracy, the loss within :data:`VALIDATION_RTOL`."""
    failures, compared = [], []
    for cell in cells:
        runs = {key: v for key, v in found.items() if key[0] == tuple(cell)}
        if not runs:
            failures.append(f"validation, {describe_cell(cell)}: no validation numbers written")
        for (_, repeat), by in sorted(runs.items()):
            where = f"validation, {describe_cell(cell)}"
            mine, theirs = by.get("mxoid_gluon"), by.get("estimator")
            if mine is None or theirs is None:
                failures.append(f"{where}: mxoid_gluon's or the estimator's numbers missing")
                continue
            pairs = list(zip(mine["epochs"], theirs["epochs"]))
            if len(mine["epochs"]) != len(theirs["epochs"]) or not pairs:
                failures.append(f"{where}: {len(mine['epochs'])} against {len(theirs['epochs'])}")
            for epoch, (a, b) in enumerate(pairs, 1):
                entry = {"cell": list(cell), "repeat": repeat, "epoch": epoch}
                entry.update(mxoid=a, estimator=b)
                entry["loss_relative_difference"] = abs(a["loss"] - b["loss"]) / abs(b["loss"])
                entry["equal"] = (
                    a["samples"] == b["samples"]
                    and a["accuracy"] == b["accuracy"]
                    and entry["loss_relative_difference"] <= VALIDATION_RTOL
                )
                compared.append(entry)
                if not entry["equal"]:
                    failures.append(f"{where}, epoch {epoch}: mxoid {a} against the estimator {b}")
    return {"ok": not failures, "failures": failures, "rtol": VALIDATION_RTOL, "epochs": compared}


# -------------------------------------------------------------------- targets
# (contender, over, limit, target?, cells): the brief's targets, then comparisons.
RATIOS = (
    ("mxoid_gluon", "gluon_hybrid_acc", 1.5, True, "mlp-32"),
    ("mxoid_gluon", REFERENCE, 1.0, True, None),
    ("mxoid_gluon", "estimator", 1.0, True, None),
    ("mxoid_gluon_loader", "estimator", 1.0, True, None),
    ("mxoid_gluon_loader", "gluon_hybrid_acc_loader", 1.2, True, None),
    ("mxoid_gluon_loader_w2", "gluon_hybrid_acc_loader_w2", 1.2, True, None),
    ("mxoid_gluon_bare", REFERENCE, 1.0, False, None),
    ("mxoid_gluon_loader", "gluon_hybrid_loader", 1.0, False, None),
    ("mxoid_gluon_loader_w2", "gluon_hybrid_loader_w2", 1.0, False, None),
    ("gluon_hybrid_acc", REFERENCE, 1.0, False, None),
    ("estimator", "gluon_hybrid_acc", 1.0, False, None),
)


def targets(rows: List[dict]) -> List[dict]:
    """Issue 30's targets for the cells of this run (``is_target``): mxoid with the
    everyday extensions >= 1.5x the Gluon loop with accuracy on MLP b32, >= 1.0x the
    Gluon loop without a metric on every cell, ahead of the estimator (on the
    iterator and on the estimator's own DataLoader); issue 38's: mxoid fed by a
    DataLoader (no worker, two workers) >= 1.2x the Gluon loop with accuracy on the
    same loader; then comparisons (ratios with
    their intervals, no target): mxoid bare, the DataLoader-fed loops, the metric's
    cost to Gluon, the estimator against the loop it replaces."""
    return ratios(rows, RATIOS, CONTEST)


def host_times(rows: List[dict]) -> List[dict]:
    """Per cell, mxoid's host time per batch (the Python thread) over the reference's."""
    index = {(r["contender"],) + contest.cell_of(r, CELL_KEYS): r for r in rows}
    found = []
    for (name, *cell), row in index.items():
        reference = index.get((REFERENCE, *cell))
        if (
            name in ("mxoid_gluon", "mxoid_gluon_bare")
            and reference
            and "samples_per_second" in row
        ):
            if "samples_per_second" in reference and reference["host_us_per_batch"] > 0:
                ratio = paired_time_ratio(row, reference)
                found.append({"contender": name, "cell": list(cell), "host_time_ratio": ratio})
    return found


def has_data_loader_iter(mxoid_root: str) -> bool:
    """Whether that checkout's mxoid has ``mxoid.data.DataLoaderIter`` (without importing it)."""
    try:
        with open(os.path.join(mxoid_root, "mxoid", "data", "__init__.py")) as f:
            return "DataLoaderIter" in f.read()
    except OSError:
        return False


# ------------------------------------------------------------ the contest suite's hooks
CELLS_HELP = "model-batch-contexts, e.g. mlp-32-1,lenet-128-2"


def samples(mode: str, cell: tuple) -> int:
    return SAMPLES[mode][cell[0]]


def contenders(names, mode: str, mxoid_root: str, named) -> tuple:
    """The DataLoader contenders left out where the checkout's mxoid has no DataLoaderIter."""
    if has_data_loader_iter(mxoid_root):
        return names, []
    notes = ["no mxoid.data.DataLoaderIter: the DataLoader contenders left out"]
    return [c for c in names if c not in LOADER_CONTENDERS], notes


def configure(plan: dict, args, mode: str) -> None:
    """``--check`` with mxoid and the estimator: both evaluate a validation set too."""
    plan["validate"] = mode == "check" and {"mxoid_gluon", "estimator"} <= set(plan["contenders"])
    plan["worker_env"] = {VALIDATE_ENV: "1"} if plan["validate"] else {}


def passes(run) -> tuple:
    """The validation numbers against the estimator's (``--check``), and the host times."""
    fields = {"host_times": host_times(run.rows)}
    if run.plan["validate"]:
        validation = compare_validation(collect_validation(run.root), run.plan["cells"])
        run.check["validation"] = validation
        run.check["failures"] += validation["failures"]
    return fields, 0


def verdict(check: dict) -> str:
    text = "every contender finite and ends with the reference's parameters (Gluon"
    text += f" hybridized, no metric; rtol {RTOL}, atol {ATOL})"
    if check.get("validation"):
        epochs = len(check["validation"]["epochs"])
        text += f"; mxoid's Evaluate equals the estimator's val_metrics ({epochs} epochs)"
    return text
