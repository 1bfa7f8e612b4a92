"""The buckets workload (``run.py buckets``): an LSTM over buckets, against BucketingModule.fit.

The contenders (:mod:`suites.workloads.buckets_contenders`) train MXNet's LSTM language model
(``examples/lstm_bucketing.py``'s ``sym_gen``) over six buckets of synthetic sentences
(fixed seed), from the same values, in the same order, with the same optimizer: a
hand-written loop binding one executor set per bucket with shared arrays, as
``BucketingModule.switch_bucket`` does (the floor, ``hand``), ``BucketingModule.fit``
with MXNet's ``Perplexity`` and without a metric, and ``mxoid.MainLoop(sym_gen, ...)``
bare and with the everyday extensions (TrainingMonitoring of perplexity without the
padding). A cell's contenders train in turns in one worker process
(:mod:`harness.contest`); all must end with the floor's parameters. Then the peak
memory of mxoid and of the floor over the six buckets against one bucket of the longest
length, each alone in a process. Exit status 1: a worker failed, non-finite parameters,
or other parameters than the floor's; speed and memory never change it.
"""

import itertools
import os
from typing import Dict, List

import numpy as np
from harness import contest, report
from harness.processes import Job, run_jobs
from harness.targets import ratios
from harness.targets import target as _target

from suites.workloads import gluon

NAME = "buckets"  # the results' name and run.py's alias

BUCKETS = (10, 20, 30, 40, 50, 60)  # sentence lengths: six buckets
LONGEST = max(BUCKETS)  # the default bucket, and the one bucket of the memory comparison
SHORTEST = 3  # the shortest sentence
DATA_SEED = 0
MODELS = {  # the LSTM's sizes: lstm_bucketing.sym_gen_of(vocabulary, hidden, embed, layers)
    "lstm": dict(layers=1, hidden=128, embed=64, vocabulary=2000),
    "lstm2": dict(layers=2, hidden=200, embed=200, vocabulary=2000),
    "tiny": dict(layers=1, hidden=32, embed=16, vocabulary=200),  # --check's
}
ALL_CONTENDERS = tuple(
    "hand bucketing_fit_metric bucketing_fit_nometric mxoid_bare mxoid_everyday".split()
)
LABELS = {
    "hand": "hand loop over buckets (floor)",
    "bucketing_fit_metric": "BucketingModule.fit, Perplexity",
    "bucketing_fit_nometric": "BucketingModule.fit, no metric",
    "mxoid_bare": "mxoid bare",
    "mxoid_everyday": "mxoid everyday extensions",
}
# Every contender computes what the floor computes: the same executors' arithmetic, the
# momentum SGD's update (the floor's fused sgd_mom_update), the same order of batches.
EQUAL_TO_HAND = tuple(c for c in ALL_CONTENDERS if c != "hand")
RTOL, ATOL = contest.RTOL, contest.ATOL
MEMORY_CONTENDER = "mxoid_everyday"
MEMORY_LIMIT = 1.3  # six buckets' training memory over one bucket's, at most


def parse_cells(text: str) -> tuple:
    """``lstm-32-1,lstm2-32-2`` -> cells ``(model, batch size, contexts)``."""
    cells = tuple((m, int(b), int(c)) for m, b, c in (item.split("-") for item in text.split(",")))
    unknown = sorted({model for model, _, _ in cells} - set(MODELS))
    if unknown:
        raise ValueError(f"unknown model {unknown[0]!r} in {text!r}; use {', '.join(MODELS)}")
    return cells


MODES = gluon.MODES  # the same rounds, processes, memory passes and parallel workers
CELLS = {
    "full": parse_cells("lstm-32-1,lstm-32-2,lstm2-32-1,lstm2-32-2"),
    "quick": parse_cells("lstm-32-1,lstm-32-2"),
    "check": parse_cells("tiny-32-1,tiny-32-2"),
}
MEMORY_CELLS = {"full": None, "quick": None, "check": 1}  # the memory pass's first cells
BATCHES_PER_BUCKET = {"full": 6, "quick": 3, "check": 1}  # an epoch's batches of each bucket


def make_sentences(count: int, model: str, seed: int = DATA_SEED):
    """``count`` sentences of random words (1 to the vocabulary; 0 pads), as many in each
    bucket, their lengths uniform within it; as rows padded to :data:`LONGEST` (float32)
    and their lengths, in a shuffled order. NumPy only (the suite counts their tokens)."""
    if count % len(BUCKETS):
        raise ValueError(f"{count} sentences: not as many for each of {len(BUCKETS)} buckets")
    rng = np.random.RandomState(seed)
    lows = (SHORTEST,) + tuple(b + 1 for b in BUCKETS[:-1])
    lengths = np.concatenate(
        [rng.randint(low, high + 1, count // len(BUCKETS)) for low, high in zip(lows, BUCKETS)]
    )
    lengths = lengths[rng.permutation(count)]
    words = rng.randint(1, MODELS[model]["vocabulary"], (count, LONGEST))
    rows = np.where(np.arange(LONGEST) < lengths[:, None], words, 0)
    return rows.astype(np.float32), lengths.astype(np.float32)


def tokens_per_epoch(cell: tuple, samples: int) -> int:
    return int(make_sentences(samples, cell[0])[1].sum())


def describe_cell(cell: tuple) -> str:
    model, batch, contexts = cell
    sizes = MODELS[model]
    return f"LSTM {sizes['layers']}x{sizes['hidden']} b{batch} {contexts} ctx"


CELL_KEYS = ("model", "batch_size", "contexts")
CONTEST = contest.Contest("suites.workloads.buckets_contenders", LABELS, describe_cell, CELL_KEYS)
CONTEST.equal_to_hand = EQUAL_TO_HAND
CONTEST.versus = "bucketing_fit_metric"


# -------------------------------------------------------------------- memory
def memory_pass(plan: dict, launcher, root: str, quiet: bool, timeout) -> List[dict]:
    """mxoid (:data:`MEMORY_CONTENDER`) and the floor, each alone in a process per cell
    and layout, a warm-up and one timed epoch: over the six buckets, and over one bucket
    of the longest length (every sentence padded to it); the peak resident memory."""
    jobs, folder = [], os.path.join(root, "buckets-memory")
    layouts = itertools.product(
        plan["memory_cells"], (MEMORY_CONTENDER, "hand"), (BUCKETS, [LONGEST])
    )
    for cell, contender, keys in layouts:
        spec = {"suite": CONTEST.suite, **dict(zip(CELL_KEYS, cell)), "epochs": 2}
        spec.update(samples=plan["samples"][cell], contender=contender, buckets=list(keys))
        jobs.append(Job(spec, cell, folder, "-".join(map(str, cell + (contender, len(keys))))))
        jobs[-1].contender = f"{contender}, {len(keys)} bucket(s)"
    if not quiet:
        print(f"Memory: {MEMORY_CONTENDER} and the floor alone, 6 buckets and 1 of {LONGEST}")
    run_jobs(jobs, plan["parallel"], launcher, quiet, timeout, describe_cell)
    found = []
    for job in jobs:
        entry = {"cell": list(job.cell), "contender": job.spec["contender"], "error": job.error}
        entry["buckets"] = job.spec["buckets"]
        if job.result is not None:
            peak, before = job.result["peak_rss_kib"], job.result["rss_before_training_kib"]
            entry.update(peak_rss_mib=peak / 1024, peak_over_start_mib=(peak - before) / 1024)
            entry.update(finite=job.result["finite"], notes=job.result["notes"])
        found.append(entry)
    return found


def memory_failures(found: List[dict]) -> List[str]:
    """A worker of the memory pass that failed, or ended with non-finite parameters."""

    def problem(e: dict) -> str:
        if e["error"]:
            return e["error"].splitlines()[0]
        return "" if e["finite"] else "non-finite parameters"

    def where(e: dict) -> str:
        return (
            f"{e['contender']} in {describe_cell(tuple(e['cell']))}, {len(e['buckets'])} bucket(s)"
        )

    return [f"memory pass: {where(e)}: {problem(e)}" for e in found if problem(e)]


def memory_targets(found: List[dict]) -> List[dict]:
    """Per cell, mxoid's training memory (the peak over the memory before training) over
    six buckets against one bucket of the longest length: at most :data:`MEMORY_LIMIT`
    (a target); then comparisons: the same for the whole process's peak, and the
    floor's training memory (MXNet's own sharing, without mxoid)."""
    index = {
        (tuple(e["cell"]), e["contender"], len(e["buckets"])): e for e in found if not e["error"]
    }
    entries = []
    for cell in dict.fromkeys(tuple(e["cell"]) for e in found):
        where = f"{describe_cell(cell)}, 6 buckets over 1 bucket of {LONGEST}"
        for contender, key, target in (
            (MEMORY_CONTENDER, "peak_over_start_mib", True),
            (MEMORY_CONTENDER, "peak_rss_mib", False),
            ("hand", "peak_over_start_mib", False),
        ):
            six, one = (index.get((cell, contender, n)) for n in (len(BUCKETS), 1))
            if six is None or one is None:
                continue
            what = "training's" if key == "peak_over_start_mib" else "whole process's"
            text = f"peak memory of {contender}, {where}, {what}"
            text += f" ({six[key]:.0f} over {one[key]:.0f} MiB)"
            text += f": <= {MEMORY_LIMIT:.2f}x" if target else ""
            ratio = six[key] / one[key] if one[key] > 0 else float("inf")
            entries.append(_target(text, ratio, MEMORY_LIMIT, "x", at_most=True))
            entries[-1]["is_target"] = target
    return entries


# -------------------------------------------------------------------- targets
RATIOS = (  # (contender, over, limit, a target?, cells): the targets, then comparisons
    ("mxoid_everyday", "hand", 0.95, True, None),
    ("mxoid_everyday", "bucketing_fit_metric", 1.3, True, None),
    ("mxoid_bare", "hand", 1.0, False, None),
    ("mxoid_everyday", "bucketing_fit_nometric", 1.0, False, None),
    ("bucketing_fit_metric", "hand", 1.0, False, None),
    ("bucketing_fit_nometric", "hand", 1.0, False, None),
)


def targets(rows: List[dict]) -> List[dict]:
    """Issue 29's targets for the cells of this run (``is_target``): mxoid with the
    everyday extensions >= 0.95 of the floor and >= 1.3x ``BucketingModule.fit`` with its
    Perplexity (with the floor's own ratio over it); then comparisons (ratios with their
    intervals, no target): mxoid bare, and what ``fit`` and its metric cost."""
    return ratios(rows, RATIOS, CONTEST, floor=True)


# -------------------------------------------------------------------- output
def add_tokens(rows: List[dict], tokens: Dict[tuple, int]) -> None:
    """Give every row that trained its tokens an epoch and its tokens per second."""
    for row in rows:
        row["tokens_per_epoch"] = count = tokens[contest.cell_of(row, CELL_KEYS)]
        if "samples_per_second" in row:
            per_sentence = count / row["samples_per_epoch"]
            rates = row["samples_per_second"].items()
            row["tokens_per_second"] = {k: v * per_sentence for k, v in rates}


def tokens_table(rows: List[dict]) -> str:
    """Tokens per second (words of the sentences, padding not counted), and the ratios."""
    body = []
    for row in rows:
        where = describe_cell(contest.cell_of(row, CELL_KEYS))
        rate = row.get("tokens_per_second")
        if rate is None:
            body.append([where, row["label"], "FAILED", "", "", ""])
            continue
        ratios = [row.get(k) for k in ("ratio_to_hand", "ratio_to_module_fit")]
        spread = "{min:,.0f}-{max:,.0f}".format(**rate)
        cells = [f"{rate['median']:,.0f}", spread] + [
            "-" if r is None else f"{r:.2f}" for r in ratios
        ]
        body.append([where, row["label"]] + cells)
    header = ["cell", "contender", "tokens/s", "min-max", "x hand", "x fit Perplexity"]
    return "\n" + report.markdown_table(header, body, "llrrrr")


VERDICT = "every contender finite and ends with the floor's parameters (the hand loop over "
VERDICT += f"buckets; rtol {RTOL}, atol {ATOL})"
LEGEND = "(a sample is a sentence; x Module: over BucketingModule.fit with Perplexity)"


# ------------------------------------------------------------ the contest suite's hooks
CELLS_HELP = "model-batch-contexts, e.g. lstm-32-1,lstm2-32-2"
SETTINGS = {"buckets": list(BUCKETS), "models": MODELS}


def samples(mode: str, cell: tuple) -> int:
    """Every sentence trains: :data:`BATCHES_PER_BUCKET` batches of each bucket an epoch."""
    return BATCHES_PER_BUCKET[mode] * cell[1] * len(BUCKETS)


def configure(plan: dict, args, mode: str) -> None:
    """The cells of the memory pass over six buckets against one: every cell's (--check:
    the first one's)."""
    plan["memory_cells"] = [] if args.no_memory else list(plan["cells"][: MEMORY_CELLS[mode]])


def passes(run) -> tuple:
    """Tokens per second in every row; the memory pass over six buckets and one."""
    plan, args = run.plan, run.args
    memory = []
    if plan["memory_cells"]:
        memory = memory_pass(plan, run.launcher, run.root, args.quiet, args.worker_timeout)
    add_tokens(run.rows, {cell: tokens_per_epoch(cell, n) for cell, n in plan["samples"].items()})
    run.check["failures"] += memory_failures(memory)
    return {"bucket_memory": memory}, len(memory)


def run_targets(rows: List[dict], fields: dict, mode: str) -> List[dict]:
    """Issue 29's targets (not in --check), then the memory's (always)."""
    found = targets(rows) if mode != "check" else []
    return found + memory_targets(fields["bucket_memory"])


def tables(data: dict) -> List[str]:
    return [LEGEND, tokens_table(data["results"])]
