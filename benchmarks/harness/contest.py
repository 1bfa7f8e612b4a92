"""Contenders side by side, cell by cell: run them, read their rows, check them, tabulate.

A suite declares a :class:`Contest` and calls :func:`run`: a cell's contenders train in
turns in worker processes, then each alone for its peak memory; a row per contender
and cell, its ratios taken round by round, its parameters against the reference's (the
hand loop's, unless the contest names another reference).
"""

import itertools
import os
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from harness import env, stats
from harness.processes import InterleavedJob, Job, run_jobs
from harness.report import markdown_table

RTOL, ATOL = 1e-5, 1e-6


@dataclass
class Contest:
    suite: str  # the worker module: CONTENDERS and prepare(spec), see harness.worker
    labels: Dict[str, str]  # contender -> its name in the tables
    describe: Callable[[tuple], str]  # cell -> its name in the tables
    cell_keys: Tuple[str, ...]  # the fields of a cell (``batch_size`` among them)
    equal_to_hand: Tuple[str, ...] = ()  # must end with the reference's parameters
    tolerance: Optional[Callable[[str, tuple], Tuple[float, float]]] = None  # RTOL, ATOL
    versus: Optional[str] = None  # the contender of the 'x Module' column
    reference: str = "hand"  # the contender every other one is compared with
    key: str = "hand"  # the rows' name for it: ratio_to_KEY, equal_to_KEY, max_abs_diff_to_KEY
    versus_key: str = "module_fit"  # the rows' name for ``versus``: ratio_to_VERSUS_KEY
    headers: Tuple[str, str] = ("x hand", "x Module")  # the table's columns of the two ratios
    reference_text: str = "the hand loop"  # the reference in failure messages
    # (contender, cell) -> whether it must end with the reference's parameters; by
    # default, whether it is in ``equal_to_hand``
    expected_equal: Optional[Callable[[str, tuple], bool]] = None
    # (cell, contenders) -> the contenders that train in that cell; by default all
    cell_contenders: Optional[Callable[[tuple, Sequence[str]], List[str]]] = None

    def expects_equal(self, name: str, cell: tuple) -> bool:
        """Whether ``name`` must end with the reference's parameters in ``cell``."""
        if self.expected_equal is not None:
            return self.expected_equal(name, cell)
        return name in self.equal_to_hand

    def contenders_of(self, cell: tuple, names: Sequence[str]) -> List[str]:
        """The contenders of ``names`` that train in ``cell``, in their order."""
        return list(names) if self.cell_contenders is None else self.cell_contenders(cell, names)


def add_options(parser, contenders: Sequence[str], cells: str, extra=()) -> None:
    """The command line of a contest suite: which contenders and cells, how many rounds
    and processes, the Markdown report, the checkout the workers import; ``extra``:
    ``(flag, help)`` switches of the suite's own."""
    add = parser.add_argument
    add("--contenders", help=f"a comma-separated subset of {', '.join(contenders)}")
    add("--cells", help=cells)
    add("--repeat", type=int, help="processes per cell (3 in a full run, else 1)")
    add("--timed-epochs", type=int, help="timed rounds of each process")
    add("--no-memory", action="store_true", help="skip the memory pass (full runs have one)")
    for flag, text in extra:
        add(flag, action="store_true", help=text)
    add("--markdown", metavar="PATH", help="also write the tables as Markdown")
    add("--report", metavar="JSON", help="run nothing: the Markdown of a results file")
    add("--mxoid", default=env.ROOT, metavar="PATH", help="the checkout the workers import")
    add("--worker-timeout", type=float, default=600.0, help="kill a hung worker after it, rerun")
    add("--quiet", action="store_true", help="no progress lines")


def apply_options(config: dict, args) -> dict:
    """``config`` (a mode's rounds, processes and memory epochs) as the command line
    changes it (:func:`add_options`)."""
    config["timed"] = args.timed_epochs or config["timed"]
    config["repeat"] = args.repeat or config["repeat"]
    config["memory_epochs"] = 0 if args.no_memory else config["memory_epochs"]
    return config


def cell_of(row: dict, keys: Sequence[str]) -> tuple:
    return tuple(row[k] for k in keys)


STAMPS = {"wall": "epoch_stamps", "cpu": "epoch_cpu_stamps", "host": "epoch_thread_stamps"}
DURATIONS = {"wall": "epoch_seconds", "cpu": "epoch_cpu_seconds", "host": "epoch_host_seconds"}


def timed_epochs(result: dict, clock: str = "wall") -> np.ndarray:
    """A worker's timed epochs in seconds (wall-clock, process CPU, or host thread): the
    turns of a contender in turns; the epochs after the warm-up of one alone."""
    if result.get("interleaved"):
        return np.asarray(result[DURATIONS[clock]], dtype=np.float64)
    return np.diff(result[STAMPS[clock]])[1:]


def _rates(group: Sequence[Job]) -> np.ndarray:
    return np.concatenate([job.samples / timed_epochs(job.result) for job in group])


def _params(job: Job) -> Dict[str, np.ndarray]:
    with np.load(os.path.join(job.workdir, "params.npz")) as data:
        return {k: data[k] for k in data.files}


def analyse(jobs: List[Job], contenders: Sequence[str], contest: Contest) -> List[dict]:
    """One row per contender and cell, in the order of the cells and ``contenders``."""
    rows = []
    for cell in dict.fromkeys(job.cell for job in jobs):
        groups: Dict[str, List[Job]] = {}
        for job in jobs:
            if job.cell == cell:
                groups.setdefault(job.contender, []).append(job)
        done = [name for name, group in groups.items() if all(j.result for j in group)]
        medians = {name: float(np.median(_rates(groups[name]))) for name in done}
        hand = groups.get(contest.reference, [])
        hand_params = _params(hand[0]) if hand and hand[0].result else None
        for name in contenders:
            if name in groups:
                rows.append(_row(name, cell, groups[name], medians, hand_params, contest))
    pair_ratios(rows, contest)
    return rows


def _row(name, cell, group, medians, hand_params, contest: Contest) -> dict:
    fields = dict(zip(contest.cell_keys, cell))
    batch, samples = fields["batch_size"], group[0].samples
    batches = -(-samples // batch)
    row = {"contender": name, "label": contest.labels[name], **fields}
    row.update(samples_per_epoch=samples, batches_per_epoch=batches)
    row.update(timed_epochs=group[0].epochs - 1, runs=len(group))
    row["errors"] = [j.error for j in group if j.error]
    if row["errors"]:
        return row
    rates, median = _rates(group), medians[name]
    hand, versus, key = medians.get(contest.reference), medians.get(contest.versus), contest.key
    interleaved = all(j.result.get("interleaved") for j in group)

    def per_batch(clock: str) -> float:
        times = np.concatenate([timed_epochs(j.result, clock) for j in group])
        return float(np.median(times)) * 1e6 / batches

    spread = dict(median=median, min=float(rates.min()), max=float(rates.max()))
    spread.update(q1=float(np.percentile(rates, 25)), q3=float(np.percentile(rates, 75)))
    row.update(samples_per_second=spread, interleaved=interleaved)
    row["epoch_seconds"] = [list(timed_epochs(j.result)) for j in group]
    row["epoch_host_seconds"] = [list(timed_epochs(j.result, "host")) for j in group]
    row.update(cpu_us_per_batch=per_batch("cpu"), host_us_per_batch=per_batch("host"))
    row["warmup_seconds"] = [_warmup(j.result) for j in group]
    row[f"ratio_to_{key}"] = median / hand if hand else None
    row[f"ratio_to_{contest.versus_key}"] = median / versus if versus else None
    row["overhead_us_per_batch"] = 1e6 * batch * (1 / median - 1 / hand) if hand else None
    row.update(peak_rss_mib=None, peak_over_start_mib=None, other_load_cores=None)
    row["attempts"] = sum(len(j.attempts) for j in group)
    row["notes"] = sorted({n for j in group for n in j.result["notes"]})
    row["finite"] = all(j.result["finite"] for j in group)
    row[f"expected_equal_to_{key}"] = contest.expects_equal(name, cell)
    if not interleaved:
        kib = [(j.result["peak_rss_kib"], j.result["rss_before_training_kib"]) for j in group]
        row["peak_rss_mib"] = max(peak for peak, _ in kib) / 1024
        row["peak_over_start_mib"] = max(peak - before for peak, before in kib) / 1024
    if all(j.foreign_load is not None for j in group):
        row["other_load_cores"] = max(j.foreign_load for j in group)
    if hand_params is not None and name != contest.reference:
        tolerance = contest.tolerance(name, cell) if contest.tolerance else (RTOL, ATOL)
        row.update(_compare(group, hand_params, *tolerance, key))
    return row


def _warmup(result: dict) -> float:
    if result.get("interleaved"):
        return float(result["warmup_seconds"])
    return float(np.diff(result["epoch_stamps"])[0])


def _compare(group: Sequence[Job], hand: Dict[str, np.ndarray], rtol: float, atol: float, key):
    """The largest difference of the group's parameters to the reference's; all close?"""
    diffs, equal = [], True
    for job in group:
        params = _params(job)
        if params.keys() != hand.keys():
            diffs.append(float("inf"))
            equal = False
            continue
        diffs.append(max(float(np.abs(params[k] - hand[k]).max()) for k in hand))
        equal = equal and all(np.allclose(params[k], hand[k], rtol=rtol, atol=atol) for k in hand)
    return {
        "rtol": rtol,
        "atol": atol,
        f"max_abs_diff_to_{key}": max(diffs),
        f"equal_to_{key}": equal,
    }


def throughput_ratio(row: dict, other: dict) -> Tuple[float, Optional[Tuple[float, float]]]:
    """``row``'s throughput over ``other``'s, and its 90% interval (None without epochs):
    round by round for rows of the same processes, else the ratio of the medians."""
    paired = stats.paired_ratio(row, other)
    if paired is not None:
        return paired
    ratio = row["samples_per_second"]["median"] / other["samples_per_second"]["median"]
    return ratio, stats.ratio_interval(row, other)


def pair_ratios(rows: List[dict], contest: Contest) -> None:
    """Give the rows of contenders in turns their round-by-round ratios to the reference
    and ``versus`` (and the overhead per batch that the ratio to the reference means)."""
    index = {(r["contender"],) + cell_of(r, contest.cell_keys): r for r in rows}
    index = {key: r for key, r in index.items() if "samples_per_second" in r}
    for (_, *cell), row in index.items():
        hand, versus = index.get((contest.reference, *cell)), index.get((contest.versus, *cell))
        if not row.get("interleaved"):
            continue
        if hand is not None and hand.get("interleaved"):
            row[f"ratio_to_{contest.key}"] = ratio = throughput_ratio(row, hand)[0]
            hand_batch = row["batch_size"] / hand["samples_per_second"]["median"]
            row["overhead_us_per_batch"] = 1e6 * hand_batch * (1 / ratio - 1)
        if versus is not None and versus.get("interleaved"):
            row[f"ratio_to_{contest.versus_key}"] = throughput_ratio(row, versus)[0]


def correctness(rows: List[dict], contest: Contest) -> dict:
    """Failures: a worker failed, non-finite parameters, or not the reference's where due."""
    failures, key, reference = [], contest.key, contest.reference_text
    for row in rows:
        where = f"{row['contender']} in {contest.describe(cell_of(row, contest.cell_keys))}"
        if row["errors"]:
            failures.append(f"{where}: {row['errors'][0].splitlines()[0]}")
        elif not row["finite"]:
            failures.append(f"{where}: non-finite parameters")
        elif row[f"expected_equal_to_{key}"] and f"equal_to_{key}" not in row:
            failures.append(f"{where}: no result of {reference} to compare with")
        elif row[f"expected_equal_to_{key}"] and not row[f"equal_to_{key}"]:
            within = f"max |diff| {row[f'max_abs_diff_to_{key}']:.3g}, rtol {row['rtol']}"
            failures.append(
                f"{where}: parameters differ from {reference}'s ({within}, atol {row['atol']})"
            )
    return {"ok": not failures, "failures": failures}


def take_memory(rows: List[dict], memory_rows: List[dict], keys: Sequence[str]) -> None:
    """Give the rows of contenders in turns the peaks of their memory pass."""
    peaks = {(r["contender"],) + cell_of(r, keys): r for r in memory_rows}
    for row in rows:
        source = peaks.get((row["contender"],) + cell_of(row, keys))
        if source and source.get("peak_rss_mib") is not None and "samples_per_second" in row:
            row["peak_rss_mib"] = source["peak_rss_mib"]
            row["peak_over_start_mib"] = source["peak_over_start_mib"]
            row["memory_from"] = "a process of its own (memory pass)"


def run(contest: Contest, plan: dict, launcher, root: str, quiet=False, worker_timeout=None):
    """Throughput in turns, then the memory pass; the rows, the correctness check of both
    passes, and the number of worker processes. ``plan``: ``cells``, ``contenders``,
    ``samples`` (per cell), ``timed`` (rounds a process), ``repeat`` (processes a cell),
    ``memory_epochs`` (timed epochs of the memory pass; none if 0), ``parallel``."""
    cells, contenders, samples = list(plan["cells"]), list(plan["contenders"]), plan["samples"]
    timed, repeat, memory_epochs = plan["timed"], plan["repeat"], plan["memory_epochs"]

    def spec(cell: tuple, epochs: int, **who) -> dict:
        fields = dict(zip(contest.cell_keys, cell))
        return {"suite": contest.suite, **fields, "samples": samples[cell], "epochs": epochs, **who}

    def name(cell: tuple, *more) -> str:
        return "-".join(str(part) for part in cell + more)

    def go(jobs: List[Job]) -> List[dict]:
        run_jobs(jobs, plan["parallel"], launcher, quiet, worker_timeout, contest.describe)
        if isinstance(jobs[0], InterleavedJob):
            jobs = [member for job in jobs for member in job.members()]
        jobs = sorted(jobs, key=lambda j: (cells.index(j.cell), contenders.index(j.contender)))
        return analyse(jobs, contenders, contest)

    workers = []
    for r, cell in itertools.product(range(repeat), cells):
        spec_ = spec(cell, 1 + timed, contenders=contest.contenders_of(cell, contenders), repeat=r)
        workers.append(InterleavedJob(spec_, cell, root, name(cell, r)))
    if not quiet:
        print(f"Throughput: a cell's contenders in turns, {timed} rounds, {repeat} process(es)")
    rows = go(workers)
    check = correctness(rows, contest)
    if not memory_epochs:
        return rows, check, len(workers)
    if not quiet:
        print(f"Memory: each contender alone, a warm-up and {memory_epochs} timed epoch(s)")
    folder = os.path.join(root, "memory")
    pairs = [(cell, c) for cell in cells for c in contest.contenders_of(cell, contenders)]
    memory = [
        Job(spec(cell, 1 + memory_epochs, contender=c), cell, folder, name(cell, c))
        for cell, c in pairs
    ]
    memory_rows = go(memory)
    take_memory(rows, memory_rows, contest.cell_keys)
    memory_check = correctness(memory_rows, contest)
    check["failures"] += [f"memory pass: {f}" for f in memory_check["failures"]]
    check["ok"] = check["ok"] and memory_check["ok"]
    return rows, check, len(workers) + len(memory)


def table(rows: List[dict], contest: Contest) -> str:
    """The rows as one Markdown table, a line per cell on its design above it."""
    lines, header = [], ["cell", "contender", "samples/s", "min-max", *contest.headers]
    header += ["us/batch", "CPU us/b", "host us/b", "peak MiB", "+MiB", "params", "load"]
    body = []
    for row in rows:
        cell = contest.describe(cell_of(row, contest.cell_keys))
        if not body or body[-1][0] != cell:
            lines.append(_design(cell, row))
        if row["errors"]:
            body.append([cell, row["label"], "FAILED: " + row["errors"][0].splitlines()[0]])
            continue
        sps = row["samples_per_second"]
        body.append(
            [cell, row["label"], f"{sps['median']:,.0f}", "{min:,.0f}-{max:,.0f}".format(**sps)]
        )
        columns = (f"ratio_to_{contest.key}", f"ratio_to_{contest.versus_key}") + _COLUMNS
        body[-1] += [_number(row.get(k), f) for k, f in zip(columns, _FORMATS)]
        body[-1].append(_params_cell(row, contest))
        body[-1].append(_number(row.get("other_load_cores"), ".2f"))
    notes = [f"note: {n}" for n in sorted({n for row in rows for n in row.get("notes", ())})]
    return "\n".join(lines + ["", markdown_table(header, body, "llrrrrrrrrrlr")] + notes)


# the row keys of the columns after the two ratios, and the formats of all of them
_COLUMNS = ("overhead_us_per_batch", "cpu_us_per_batch", "host_us_per_batch", "peak_rss_mib")
_COLUMNS += ("peak_over_start_mib",)
_FORMATS = (".2f", ".2f", "+.0f", ",.0f", ",.0f", ".0f", ".0f")


def _number(value, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _design(cell: str, row: dict) -> str:
    if row.get("interleaved"):
        design = f"in turns: {row['runs']} process(es) of {row['timed_epochs']} rounds"
    else:
        design = f"warm-up + {row['timed_epochs']} timed epochs, {row['runs']} run(s)"
    batches = f"{row['samples_per_epoch']} samples/epoch, {row['batches_per_epoch']} batches"
    return f"{cell}: {batches}, {design}"


def _params_cell(row: dict, contest: Contest) -> str:
    """``ref`` (the reference), ``equal``, ``DIFF`` (a failure), ``NONFIN``, or the
    largest difference of a contender not expected to match (Gluon's other loss)."""
    key = contest.key
    if row["contender"] == contest.reference:
        return "ref"
    if not row["finite"]:
        return "NONFIN"
    if f"equal_to_{key}" not in row:
        return "?"
    if row[f"equal_to_{key}"]:
        return "equal"
    return "DIFF" if row[f"expected_equal_to_{key}"] else f"{row[f'max_abs_diff_to_{key}']:.0e}"
