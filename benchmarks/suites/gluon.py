"""The gluon suite: mxoid training a Gluon HybridBlock against Gluon's own loops.

The contenders (:mod:`suites.gluon_contenders`) train the same Gluon network from the
same values on the same data with the same optimizer: a hand-written hybridized Gluon
loop (the reference, ``gluon_hybrid``), the same with an accuracy metric updated every
batch, ``mxoid.MainLoop(net, ...)`` with the everyday extensions and bare, Gluon's
``Estimator``, and the hand loop and mxoid fed by one ``DataLoader`` (no worker, two
workers). A cell's contenders train in turns in one worker process
(:mod:`harness.contest`); all must end with the reference's parameters. ``--check``
also compares mxoid's ``Evaluate`` with the estimator's validation metrics. Exit
status 1: a worker failed, non-finite parameters, other parameters than the
reference's, or other validation numbers than the estimator's; speed never changes it.
"""

import glob
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from typing import Dict, List, Optional, Sequence

from harness import contest, env, report
from harness.processes import Launcher
from harness.stats import paired_time_ratio

from suites import loop

REFERENCE = "gluon_hybrid"
INTERNAL_REFERENCE = "hand"  # the name harness.contest compares every contender with
LOADER_CONTENDERS = (
    "gluon_hybrid_loader mxoid_gluon_loader gluon_hybrid_loader_w2 mxoid_gluon_loader_w2".split()
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
    "gluon_hybrid_loader_w2": "Gluon hybridized, DataLoader 2 workers",
    "mxoid_gluon_loader_w2": "mxoid everyday, DataLoader 2 workers",
}
# Every contender computes what the reference computes: the same graph, the same
# optimizer steps, the same data in the same order (see suites.gluon_contenders).
EQUAL_TO_REFERENCE = tuple(c for c in ALL_CONTENDERS if c != REFERENCE)
RTOL, ATOL = contest.RTOL, contest.ATOL
VALIDATION_RTOL = 1e-5  # the validation loss: the same network evaluated, summed otherwise


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
TARGETS_TEXT = loop.TARGETS_TEXT


def describe_cell(cell: tuple) -> str:
    model, batch, contexts = cell
    return f"{'MLP' if model == 'mlp' else 'LeNet'} b{batch} {contexts} ctx"


CELL_KEYS = ("model", "batch_size", "contexts")
CONTEST = contest.Contest(
    "suites.gluon_contenders",
    {INTERNAL_REFERENCE: LABELS[REFERENCE], **LABELS},
    describe_cell,
    CELL_KEYS,
)
CONTEST.equal_to_hand = EQUAL_TO_REFERENCE
CONTEST.versus = "gluon_hybrid_acc"


def internal(name: str) -> str:
    """The contest's name of a contender (the reference is its ``hand``)."""
    return INTERNAL_REFERENCE if name == REFERENCE else name


def as_reference(rows: List[dict], check: dict) -> None:
    """Name the contest's ``hand`` row and its comparisons after the reference."""
    renamed = {
        "ratio_to_hand": "ratio_to_reference",
        "ratio_to_module_fit": "ratio_to_gluon_hybrid_acc",
        "equal_to_hand": "equal_to_reference",
        "max_abs_diff_to_hand": "max_abs_diff_to_reference",
        "expected_equal_to_hand": "expected_equal_to_reference",
    }
    for row in rows:
        if row["contender"] == INTERNAL_REFERENCE:
            row["contender"] = REFERENCE
        for old, new in renamed.items():
            if old in row:
                row[new] = row.pop(old)

    def rename(failure: str) -> str:
        failure = failure.replace("the hand loop's", "the reference's")
        for lead in ("", "memory pass: "):
            if failure.startswith(f"{lead}{INTERNAL_REFERENCE} in "):
                return lead + REFERENCE + failure[len(lead + INTERNAL_REFERENCE) :]
        return failure

    check["failures"] = [rename(f) for f in check["failures"]]


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
def _ratio(text: str, row: dict, other: dict, limit: float, target: bool) -> dict:
    measured, interval = contest.throughput_ratio(row, other)
    entry = {"target": text, "measured": measured, "limit": limit, "met": measured >= limit}
    entry.update(unit="x", is_target=target)
    if interval is not None:
        entry["interval"] = list(interval)
        entry["within_noise"] = interval[0] <= limit <= interval[1]
    return entry


# (contender, over, limit, target?, cells): the brief's targets, then comparisons.
RATIOS = (
    ("mxoid_gluon", "gluon_hybrid_acc", 1.5, True, "mlp-32"),
    ("mxoid_gluon", REFERENCE, 1.0, True, None),
    ("mxoid_gluon", "estimator", 1.0, True, None),
    ("mxoid_gluon_loader", "estimator", 1.0, True, None),
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
    iterator and on the estimator's own DataLoader); then comparisons (ratios with
    their intervals, no target): mxoid bare, the DataLoader-fed loops, the metric's
    cost to Gluon, the estimator against the loop it replaces."""
    index = {
        (r["contender"],) + contest.cell_of(r, CELL_KEYS): r
        for r in rows
        if "samples_per_second" in r
    }
    cells = list(dict.fromkeys(contest.cell_of(r, CELL_KEYS) for r in rows))
    found = []
    for cell in cells:
        for contender, over, limit, target, where in RATIOS:
            mine, theirs = index.get((contender, *cell)), index.get((over, *cell))
            if mine is None or theirs is None or (where and f"{cell[0]}-{cell[1]}" != where):
                continue
            text = f"{contender} over {over}, {describe_cell(cell)}"
            text += f": >= {limit:.2f}x" if target else ""
            found.append(_ratio(text, mine, theirs, limit, target))
    return found


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


# -------------------------------------------------------------------- output
def _number(value, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _params_cell(row: dict) -> str:
    if row["contender"] == REFERENCE:
        return "ref"
    if not row["finite"]:
        return "NONFIN"
    if "equal_to_reference" not in row:
        return "?"
    if row["equal_to_reference"]:
        return "equal"
    return (
        "DIFF" if row["expected_equal_to_reference"] else f"{row['max_abs_diff_to_reference']:.0e}"
    )


COLUMNS = (  # row key, format
    ("ratio_to_reference", ".2f"),
    ("ratio_to_gluon_hybrid_acc", ".2f"),
    ("overhead_us_per_batch", "+.0f"),
    ("cpu_us_per_batch", ",.0f"),
    ("host_us_per_batch", ",.0f"),
    ("peak_rss_mib", ".0f"),
)


def table(rows: List[dict]) -> str:
    """The rows as one Markdown table, a line per cell on its design above it."""
    header = ["cell", "contender", "samples/s", "min-max", "x gluon", "x gluon acc", "us/batch"]
    header += ["CPU us/b", "host us/b", "peak MiB", "params", "load"]
    lines, body, last = [], [], None
    for row in rows:
        cell = describe_cell(contest.cell_of(row, CELL_KEYS))
        if cell != last:
            design = f"in turns: {row['runs']} process(es) of {row['timed_epochs']} rounds"
            batches = (
                f"{row['samples_per_epoch']} samples/epoch, {row['batches_per_epoch']} batches"
            )
            lines.append(f"{cell}: {batches}, {design}")
            last = cell
        if row["errors"]:
            body.append([cell, row["label"], "FAILED: " + row["errors"][0].splitlines()[0]])
            continue
        sps = row["samples_per_second"]
        body.append([cell, row["label"], f"{sps['median']:,.0f}"])
        body[-1].append("{min:,.0f}-{max:,.0f}".format(**sps))
        body[-1] += [_number(row.get(k), f) for k, f in COLUMNS] + [_params_cell(row)]
        body[-1].append(_number(row.get("other_load_cores"), ".2f"))
    notes = [f"note: {n}" for n in sorted({n for row in rows for n in row.get("notes", ())})]
    return "\n".join(lines + ["", report.markdown_table(header, body, "llrrrrrrrrlr")] + notes)


def ratios_table(found: List[dict]) -> str:
    rows = []
    for entry in found:
        met = loop.VERDICT_CELLS[loop.verdict(entry)] if entry["is_target"] else "(comparison)"
        rows.append([entry["target"], loop.format_measured(entry), met])
    table_ = report.markdown_table(["target or comparison", "measured", "met"], rows, "lrl")
    return f"\nTargets and comparisons ({TARGETS_TEXT})\n\n{table_}"


def markdown(data: dict) -> str:
    machine = data["machine"]
    changes = " with uncommitted changes" if machine["mxoid_uncommitted_changes"] else ""
    lines = [
        f"Run of {data['date']}: `python {data['command']}` ({data['seconds'] / 60:.0f} min), "
        f"{machine['nproc']} CPUs ({machine['cpu']}), Python {machine['python']}, MXNet "
        f"{data.get('mxnet')}, mxoid {machine['mxoid_commit']}{changes}.\n",
        table(data["results"]),
    ]
    if data.get("targets"):
        lines.append(ratios_table(data["targets"]))
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------- main
def _parser():
    parser = report.parser(__doc__, "gluon")
    contest.add_options(parser, ALL_CONTENDERS, "model-batch-contexts, e.g. mlp-32-1,lenet-128-2")
    return parser


def has_data_loader_iter(mxoid_root: str) -> bool:
    """Whether that checkout's mxoid has ``mxoid.data.DataLoaderIter`` (without importing it)."""
    try:
        with open(os.path.join(mxoid_root, "mxoid", "data", "__init__.py")) as f:
            return "DataLoaderIter" in f.read()
    except OSError:
        return False


def _configure(parser, args, mxoid_root: str) -> dict:
    mode = "check" if args.check else "quick" if args.quick else "full"
    config = dict(MODES[mode], cells=CELLS[mode])
    config["memory_epochs"] = config.pop("memory")
    contenders = list(ALL_CONTENDERS)
    if args.contenders:
        contenders = args.contenders.split(",")
        unknown = sorted(set(contenders) - set(ALL_CONTENDERS))
        if unknown:
            parser.error(f"unknown contenders {unknown}")
        if REFERENCE not in contenders:
            contenders.insert(0, REFERENCE)  # the reference for ratios and parameters
    config["notes"] = []
    if not has_data_loader_iter(mxoid_root):
        contenders = [c for c in contenders if c not in LOADER_CONTENDERS]
        config["notes"].append("no mxoid.data.DataLoaderIter: the DataLoader contenders left out")
    config["contenders"] = [internal(c) for c in contenders]
    try:
        config["cells"] = parse_cells(args.cells) if args.cells else config["cells"]
    except ValueError as error:
        parser.error(str(error))
    config["samples"] = {cell: SAMPLES[mode][cell[0]] for cell in config["cells"]}
    return contest.apply_options(config, args)


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    args = parser.parse_args(argv)
    if report.print_report(args, markdown):
        return 0
    mxoid_root = report.mxoid_root(parser, args)
    run, plan = report.Run("gluon", args, argv), _configure(parser, args, mxoid_root)
    environment, machine = env.worker_env(mxoid_root), env.machine_info(mxoid_root)
    validate = run.mode == "check" and {"mxoid_gluon", "estimator"} <= set(plan["contenders"])
    if validate:
        environment["GLUON_SUITE_VALIDATE"] = "1"  # see suites.gluon_contenders
    changes = " + uncommitted changes" if machine["mxoid_uncommitted_changes"] else ""
    where = f"{machine['nproc']} CPUs ({machine['cpu']}), Python {machine['python']}"
    print(f"gluon suite, {run.mode}: {where}, mxoid {machine['mxoid_commit']}{changes}", flush=True)
    for note in plan["notes"]:
        print(f"note: {note}")
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # KeyboardInterrupt: clean up
    root = tempfile.mkdtemp(prefix="mxoid-bench-gluon-")
    try:
        launcher, timeout = Launcher(environment), args.worker_timeout
        rows, check, processes = contest.run(CONTEST, plan, launcher, root, args.quiet, timeout)
        validation = (
            compare_validation(collect_validation(root), plan["cells"]) if validate else None
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    as_reference(rows, check)
    if validation is not None:
        check["validation"] = validation
        check["failures"] += validation["failures"]
        check["ok"] = check["ok"] and validation["ok"]
    found = targets(rows) if run.mode != "check" else []
    check.update(rtol=RTOL, atol=ATOL, reference=REFERENCE)
    check["equal_to_reference_expected_for"] = list(EQUAL_TO_REFERENCE)
    _print(rows, check, found, run.mode)
    print(f"\n{processes} worker processes in {time.perf_counter() - run.started:.0f} s")
    settings = {**plan, "samples": SAMPLES[run.mode], "design": "interleaved", "warmup_epochs": 1}
    settings["contenders"] = [
        REFERENCE if c == INTERNAL_REFERENCE else c for c in plan["contenders"]
    ]
    settings.update(timed_epochs=plan["timed"], memory_pass=bool(plan["memory_epochs"]))
    kept = [k for k in environment if k in env.WORKER_ENV or k.startswith(("MXNET_", "OMP_"))]
    fields = {"worker_env": {k: environment[k] for k in kept}, "settings": settings}
    fields.update(results=rows, correctness=check, targets=found, host_times=host_times(rows))
    data = run.write(fields, mxoid_root, own_load=False)  # its workers would count
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(markdown(data))
        print(f"Markdown written to {args.markdown}")
    return 0 if check["ok"] else 1


def _print(rows, check, found, mode) -> None:
    print(table(rows))
    if mode == "check":
        print("(--check runs two workers at once on tiny epochs: the speed columns mean nothing)")
    verdict = "every contender finite and ends with the reference's parameters (Gluon"
    verdict += f" hybridized, no metric; rtol {RTOL}, atol {ATOL})"
    if check.get("validation"):
        epochs = len(check["validation"]["epochs"])
        verdict += f"; mxoid's Evaluate equals the estimator's val_metrics ({epochs} epochs)"
    print("\nCorrectness: " + (verdict if check["ok"] else "FAILED"))
    for failure in check["failures"]:
        print(f"  - {failure}")
    if found:
        print(ratios_table(found))
