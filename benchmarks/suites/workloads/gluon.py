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

Two cells have contenders of their own (:func:`cell_contenders`): ``jitter`` (issue 38's
setting, :mod:`suites.workloads.gluon_models`) the reference and the ``DataLoader``
contenders, whose loader adds a random jitter: none can end with the reference's
parameters (it reads the digits unjittered, and Gluon's loops draw the jitter from the
generators' running state), but mxoid's loaders with no worker and two must end with the
same ones (the same augmentation whatever the workers; :func:`augmentation_check`);
``resnet18`` (the model zoo's ResNet-18) the in-memory loops and mxoid, no estimator.
"""

import glob
import json
import os
from typing import Dict, List

import numpy as np
from harness import contest
from harness.stats import paired_time_ratio
from harness.targets import ratios

from suites.workloads.gluon_models import MODELS

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
        if model not in MODELS:
            raise ValueError(f"cell {item!r}: unknown model {model!r}; use {', '.join(MODELS)}")
        cells.append((model, int(batch), int(contexts)))
    return tuple(cells)


MODES = {  # timed: rounds a process; repeat: processes a cell; memory: its pass's timed epochs
    "full": dict(timed=8, repeat=3, memory=1, parallel=1),
    "quick": dict(timed=6, repeat=1, memory=0, parallel=1),
    "check": dict(timed=2, repeat=1, memory=0, parallel=2),
}
CELLS = {
    "full": parse_cells(
        "mlp-32-1,mlp-32-2,mlp-128-1,mlp-128-2,lenet-128-1,lenet-128-2,jitter-32-1,"
        "resnet18-32-1,resnet18-32-2"
    ),
    "quick": parse_cells("mlp-32-1,mlp-32-2,jitter-32-1"),
    "check": parse_cells("mlp-32-1,mlp-32-2,lenet-32-2,jitter-32-1,resnet18-4-2"),
}
SAMPLES = {  # samples an epoch, by model (the digits: all of them, 56 batches of 32 and 5)
    "full": {"mlp": 8192, "lenet": 1024, "jitter": 1797, "resnet18": 96},
    "quick": {"mlp": 4096, "lenet": 512, "jitter": 1797, "resnet18": 64},
    "check": {"mlp": 256, "lenet": 224, "jitter": 200, "resnet18": 8},
}
MODEL_NAMES = {
    "mlp": "MLP",
    "lenet": "LeNet",
    "jitter": "digits MLP, jitter",
    "resnet18": "ResNet-18",
}
RESNET_CONTENDERS = (REFERENCE, "gluon_hybrid_acc", "mxoid_gluon", "mxoid_gluon_bare")


def describe_cell(cell: tuple) -> str:
    model, batch, contexts = cell
    return f"{MODEL_NAMES[model]} b{batch} {contexts} ctx"


def cell_contenders(cell: tuple, names) -> list:
    """The contenders that train in ``cell``: the reference and the DataLoader ones in the
    jitter cell, :data:`RESNET_CONTENDERS` on the ResNet, all of ``names`` elsewhere."""
    if cell[0] == "jitter":
        return [n for n in names if n == REFERENCE or n in LOADER_CONTENDERS]
    if cell[0] == "resnet18":
        return [n for n in names if n in RESNET_CONTENDERS]
    return list(names)


def expected_equal(name: str, cell: tuple) -> bool:
    """Whether ``name`` must end with the reference's parameters in ``cell`` (not with the
    jitter: see the module's documentation)."""
    return cell[0] != "jitter" and name in EQUAL_TO_REFERENCE


CELL_KEYS = ("model", "batch_size", "contexts")
CONTEST = contest.Contest("suites.workloads.gluon_contenders", LABELS, describe_cell, CELL_KEYS)
CONTEST.equal_to_hand, CONTEST.versus = EQUAL_TO_REFERENCE, "gluon_hybrid_acc"
CONTEST.reference, CONTEST.key, CONTEST.versus_key = REFERENCE, "reference", "gluon_hybrid_acc"
CONTEST.headers, CONTEST.reference_text = ("x gluon", "x gluon acc"), "the reference"
CONTEST.cell_contenders, CONTEST.expected_equal = cell_contenders, expected_equal
AUGMENTED = ("mxoid_gluon_loader", "mxoid_gluon_loader_w2")  # the same jittered samples


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
# Issue 38's DataLoader target (1.2x the Gluon loop with accuracy on the same loader) is
# set on the MLPs (b32, where the issue measured it, and b128) and the jitter
# setting. On LeNet the graph's compute is nearly all of a batch (the Gluon loop with
# accuracy is 1.00x the loop without; mxoid in memory 1.01-1.03x): no loop can be 1.2x
# there, and the ratio is a comparison.
LOADER_TARGET_CELLS = ("mlp-32", "mlp-128", "jitter-32")
COMPUTE_BOUND_CELLS = ("lenet-32", "lenet-128")
# (contender, over, limit, target?, cells): the brief's targets, then comparisons.
RATIOS = (
    ("mxoid_gluon", "gluon_hybrid_acc", 1.5, True, "mlp-32"),
    ("mxoid_gluon", "gluon_hybrid_acc", 1.0, True, "resnet18-32"),
    ("mxoid_gluon", REFERENCE, 1.0, True, None),
    ("mxoid_gluon", "estimator", 1.0, True, None),
    ("mxoid_gluon_loader", "estimator", 1.0, True, None),
    ("mxoid_gluon_loader", "gluon_hybrid_acc_loader", 1.2, True, LOADER_TARGET_CELLS),
    ("mxoid_gluon_loader_w2", "gluon_hybrid_acc_loader_w2", 1.2, True, LOADER_TARGET_CELLS),
    ("mxoid_gluon_loader", "gluon_hybrid_acc_loader", 1.2, False, COMPUTE_BOUND_CELLS),
    ("mxoid_gluon_loader_w2", "gluon_hybrid_acc_loader_w2", 1.2, False, COMPUTE_BOUND_CELLS),
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
    same loader (on the MLPs and the jitter cell; on LeNet a comparison), mxoid everyday
    >= 1.0x the Gluon loop with accuracy on the ResNet-18; then comparisons (ratios with
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
    """The validation numbers against the estimator's (``--check``), mxoid's jittered
    samples with and without workers (:func:`augmentation_check`), and the host times."""
    fields = {"host_times": host_times(run.rows)}
    if run.plan["validate"]:
        both = {"mxoid_gluon", "estimator"}
        cells = [c for c in run.plan["cells"] if both <= set(cell_contenders(c, both))]
        validation = compare_validation(collect_validation(run.root), cells)
        run.check["validation"] = validation
        run.check["failures"] += validation["failures"]
    jittered = [c for c in run.plan["cells"] if c[0] == "jitter"]
    if jittered and set(AUGMENTED) <= set(run.plan["contenders"]):
        augmentation = augmentation_check(run.root, jittered, run.plan["repeat"])
        run.check["augmentation"] = augmentation
        run.check["failures"] += augmentation["failures"]
    return fields, 0


def augmentation_check(root: str, cells, repeat: int) -> dict:
    """mxoid fed by the jittered DataLoader with no worker and with two must end with the
    same parameters (rtol :data:`RTOL`): each batch's augmentation is seeded by mxoid, the
    same whatever the process that loads it. Per cell and process (the last attempt)."""
    failures, compared = [], []
    for cell in cells:
        for r in range(repeat):
            name = "-".join(str(part) for part in tuple(cell) + (r,))
            found = {}
            for contender in AUGMENTED:
                paths = sorted(glob.glob(os.path.join(root, name, "attempt*", contender, "*.npz")))
                if paths:
                    with np.load(paths[-1]) as data:
                        found[contender] = {k: data[k] for k in data.files}
            where = f"augmentation, {describe_cell(cell)}, process {r}"
            if len(found) < 2:
                failures.append(
                    f"{where}: parameters of {sorted(set(AUGMENTED) - set(found))} missing"
                )
                continue
            one, two = (found[c] for c in AUGMENTED)
            differs = max(float(np.abs(one[k] - two[k]).max()) for k in one)
            equal = one.keys() == two.keys() and all(
                np.allclose(one[k], two[k], rtol=RTOL, atol=ATOL) for k in one
            )
            compared.append(
                {"cell": list(cell), "repeat": r, "max_abs_diff": differs, "equal": equal}
            )
            if not equal:
                failures.append(
                    f"{where}: {AUGMENTED[0]} and {AUGMENTED[1]} differ by {differs:.3g}"
                )
    return {"ok": not failures, "failures": failures, "compared": compared}


def verdict(check: dict) -> str:
    text = "every contender finite and ends with the reference's parameters (Gluon"
    text += f" hybridized, no metric; rtol {RTOL}, atol {ATOL})"
    if check.get("augmentation"):
        text += "; in the jitter cell mxoid ends alike with and without workers"
    if check.get("validation"):
        epochs = len(check["validation"]["epochs"])
        text += f"; mxoid's Evaluate equals the estimator's val_metrics ({epochs} epochs)"
    return text
