"""The prefetch suite: training on a slow Python iterator, with and without Prefetch.

The iterator sleeps ``S`` a batch (letting go of the GIL, as reading does), ``S`` set
so that data and compute rates are alike, and ``2S``; rotating round after round.
Target: Prefetch at 0.9 of min(data rate, compute rate). ``--check``: training with
and without Prefetch ends bit-identical.
"""

import sys
import time
from typing import Dict, List, Optional, Sequence

import mxnet as mx
import numpy as np
from harness import report, turns, workload

import mxoid
from mxoid.data import Prefetch

BATCH, DEPTH, TARGET = 64, 2, 0.9
OPTIMIZER_PARAMS = {"learning_rate": 0.05, "momentum": 0.9}
MODES = {"full": (150, 4, 5, 5), "quick": (80, 2, 3, 4), "check": (8, 2, 0, 0)}
KEYS = ("batches", "epochs", "rounds", "calibration_runs")  # batches an epoch; timed epochs
CHECK_SLEEP = 0.0005
KINDS = ("compute", "data", "plain", "prefetch")
B = "batches_per_second"
LABELS = {
    "data": "data alone (slow iterator, no training)",
    "compute": "compute alone (NDArrayIter, no sleep)",
    "plain": "training on the slow iterator",
    "prefetch": f"training on Prefetch(slow iterator, depth={DEPTH})",
}


class SlowIter(mx.io.DataIter):
    """Batches of ``(X, y)`` in order, each after ``time.sleep(seconds)``: slices of
    NDArrays already in memory, or (``from_numpy``) built from NumPy each time."""

    def __init__(self, X, y, batch_size: int, seconds: float, from_numpy: bool = False) -> None:
        super().__init__(batch_size)
        self.seconds, self.from_numpy = seconds, from_numpy
        self.X, self.y = (X, y) if from_numpy else (mx.nd.array(X), mx.nd.array(y))
        self.count, self.cursor = len(X), 0
        self.provide_data = [mx.io.DataDesc("data", (batch_size,) + X.shape[1:])]
        self.provide_label = [mx.io.DataDesc("softmax_label", (batch_size,))]

    def reset(self) -> None:
        self.cursor = 0

    def next(self) -> mx.io.DataBatch:
        start = self.cursor
        if start + self.batch_size > self.count:
            raise StopIteration
        self.cursor += self.batch_size
        time.sleep(self.seconds)
        data, label = self.X[start : self.cursor], self.y[start : self.cursor]
        if self.from_numpy:
            data, label = mx.nd.array(data), mx.nd.array(label)
        descs = dict(provide_data=self.provide_data, provide_label=self.provide_label)
        return mx.io.DataBatch(data=[data], label=[label], pad=0, **descs)


class Bench:
    """The data set, the network and the initial parameters every run starts from."""

    def __init__(self, batches: int, from_numpy: bool = False) -> None:
        self.batches, self.from_numpy = batches, from_numpy
        self.X, self.y = workload.make_data("mlp", batches * BATCH)
        self.init, self.symbol = workload.initial_params("mlp"), workload.build_symbol("mlp")

    def iterator(self, kind: str, seconds: float = 0.0) -> mx.io.DataIter:
        if kind == "compute":
            options = dict(batch_size=BATCH, shuffle=False, label_name="softmax_label")
            return mx.io.NDArrayIter(self.X, self.y, **options)
        slow = SlowIter(self.X, self.y, BATCH, seconds, self.from_numpy)
        return Prefetch(slow, depth=DEPTH) if kind == "prefetch" else slow

    def train(self, iterator: mx.io.DataIter, epochs: int):
        """Train 1 warm-up + ``epochs`` epochs; the loop and its timed epochs' seconds."""
        clock = workload.EpochClock()
        init = {k: mx.nd.array(v) for k, v in self.init.items()}
        stop = [mxoid.FinishAfter(after_n_epochs=1 + epochs), workload.clock_extension(clock)]
        options = dict(optimizer_params=dict(OPTIMIZER_PARAMS), arg_params=init, extensions=stop)
        loop = mxoid.MainLoop(self.symbol, iterator, **options)
        clock.tick()
        loop.run()
        return loop, np.diff(clock.stamps)[1:]

    def read(self, iterator: mx.io.DataIter, epochs: int) -> np.ndarray:
        """Read 1 warm-up + ``epochs`` epochs without training; the timed epochs' seconds."""
        stamps = []
        for _ in range(1 + epochs):
            iterator.reset()
            for _ in iterator:
                pass
            mx.nd.waitall()
            stamps.append(time.perf_counter())
        return np.diff(stamps)

    def rate(self, kind: str, seconds: float, epochs: int) -> Dict[str, object]:
        """Batches per second of one run: its median timed epoch."""
        iterator = self.iterator(kind, seconds)
        if kind == "data":
            epoch_seconds = self.read(iterator, epochs)
        else:
            epoch_seconds = self.train(iterator, epochs)[1]
        rates = self.batches / epoch_seconds
        return {"batches_per_second": float(np.median(rates)), "epoch_rates": rates.tolist()}


def check(bench: Bench, seconds: float, epochs: int) -> List[str]:
    """Training with and without Prefetch: the same batches, bit-identical parameters."""
    failures, params, iterations = [], {}, {}
    for kind in ("plain", "prefetch"):
        loop, _ = bench.train(bench.iterator(kind, seconds), epochs)
        arg, aux = loop.get_params()
        params[kind] = {k: v.asnumpy() for k, v in {**arg, **aux}.items()}
        iterations[kind] = loop.status.iterations_done
    if iterations["plain"] != iterations["prefetch"]:
        failures.append(f"batches trained differ: {iterations}")
    if set(params["plain"]) != set(params["prefetch"]):
        failures.append("parameter names differ")
    for name, value in params["plain"].items():
        other = params["prefetch"].get(name)
        if other is None or not np.array_equal(value, other):
            worst = float(np.abs(value - other).max()) if other is not None else float("nan")
            failures.append(f"{name}: not bit-identical with Prefetch (max |diff| {worst:.3g})")
    if np.array_equal(params["plain"]["fc1_weight"], bench.init["fc1_weight"]):
        failures.append("training did not change fc1_weight: the comparison would be vacuous")
    if not all(np.isfinite(v).all() for v in params["prefetch"].values()):
        failures.append("non-finite parameters")
    return failures


def summarize(runs: List[Dict[str, object]]) -> Dict[str, object]:
    rates = [r["batches_per_second"] for r in runs]
    summary = {"batches_per_second": float(np.median(rates)), "min": float(np.min(rates))}
    return {**summary, "max": float(np.max(rates)), "runs": runs}


def calibrate(bench: Bench, settings: dict) -> dict:
    """The compute rate (its first run a warm-up), and from it ``S`` and ``2S``."""
    epochs = settings["epochs"]
    calibration = [bench.rate("compute", 0.0, epochs) for _ in range(settings["calibration_runs"])]
    compute_rate = float(np.median([r["batches_per_second"] for r in calibration[1:]]))
    compute_seconds = 1.0 / compute_rate
    # The iterator costs more than its sleep (oversleeping; building the batch): one
    # correction, so that the data rate at S is about the compute rate.
    probe = bench.rate("data", compute_seconds, epochs)["batches_per_second"]
    overhead = 1.0 / probe - compute_seconds
    base = round(max(1e-4, compute_seconds - overhead), 4)  # to 0.1 ms
    print(f"compute alone: {compute_rate:.0f} batches/s; the iterator's own cost per batch")
    print(f"{1e3 * overhead:.2f} ms -> S = {1e3 * base:.1f} ms")
    measured = {"calibration": calibration, "compute_rate_calibration": compute_rate}
    measured["sleeps"] = {"S": base, "2S": 2 * base}
    return {**measured, "iterator_overhead_seconds": overhead}


def measure(bench: Bench, settings: dict) -> dict:
    measured = calibrate(bench, settings)
    sleeps = measured["sleeps"]
    jobs = ["compute"] + [f"{kind} {case}" for case in sleeps for kind in KINDS[1:]]

    def one(job: str) -> dict:
        kind, *case = job.split()
        return bench.rate(kind, sleeps[case[0]] if case else 0.0, settings["epochs"])

    runs = turns.interleave(one, jobs, settings["rounds"], turns.rotation)
    compute = summarize(runs["compute"])
    measured["cases"] = [_case(case, seconds, compute, runs) for case, seconds in sleeps.items()]
    return measured


def _case(case: str, seconds: float, compute: dict, runs: Dict[str, list]) -> dict:
    entries = {kind: summarize(runs[f"{kind} {case}"]) for kind in KINDS[1:]}
    entries["compute"] = compute
    rate = {kind: entry["batches_per_second"] for kind, entry in entries.items()}
    floor = min(rate["data"], rate["compute"])
    runs = zip(*(entries[kind]["runs"] for kind in ("prefetch", "data", "compute")))
    per_round = [p[B] / min(d[B], c[B]) for p, d, c in runs]
    entry = {"case": case, "sleep_seconds": seconds, **entries, "min_rate": floor}
    entry["serial_rate"] = 1.0 / (1.0 / rate["data"] + 1.0 / rate["compute"])
    entry["prefetch_over_min_rate"] = rate["prefetch"] / floor
    entry["plain_over_min_rate"] = rate["plain"] / floor
    entry["prefetch_over_plain"] = rate["prefetch"] / rate["plain"]
    entry["prefetch_over_min_rate_per_round_median"] = float(np.median(per_round))
    return {**entry, "target": TARGET, "met": rate["prefetch"] / floor >= TARGET}


def tables(cases: List[dict]) -> str:
    """The contenders' rates, and a line per case on Prefetch against its target."""
    rows, lines = [], []
    for case in cases:
        floor, sleep = case["min_rate"], f"{case['case']} = {1e3 * case['sleep_seconds']:.1f} ms"
        for kind, label in LABELS.items():
            rate, spread = case[kind][B], "{min:,.0f}-{max:,.0f}".format(**case[kind])
            rows.append([sleep, label, f"{rate:,.0f}", f"{1e3 / rate:.2f}", spread])
            rows[-1].append(f"{rate / floor:.2f}")
        if "serial_rate" in case:
            met = f"{'met' if case['met'] else 'not met'}: target {TARGET}"
            ratios = f"Prefetch / min rate {case['prefetch_over_min_rate']:.2f} ({met})"
            ratios += f", Prefetch / plain {case['prefetch_over_plain']:.2f}"
            lines.append(f"{sleep}: {ratios}, serial {case['serial_rate']:,.0f} batches/s")
    header = "sleep per batch|contender|batches/s|ms/batch|min-max|x min(data, compute)"
    return "\n".join([report.markdown_table(header, rows, "llrrrr"), *lines])


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = report.parser(__doc__, "prefetch")
    parser.add_argument("--from-numpy", action="store_true", help="build each batch from NumPy")
    args = parser.parse_args(argv)
    run = report.Run("prefetch", args, argv)
    settings = dict(zip(KEYS, MODES[run.mode]))
    bench, failures, measured = Bench(settings["batches"], args.from_numpy), [], None
    if args.check:
        failures = check(bench, CHECK_SLEEP, settings["epochs"])
        # The reporting path, on numbers of no meaning (one tiny run each).
        one = {k: summarize([bench.rate(k, CHECK_SLEEP, 1)]) for k in KINDS}
        floor = min(one["data"]["batches_per_second"], one["compute"]["batches_per_second"])
        print(tables([{"case": "S", "sleep_seconds": CHECK_SLEEP, "min_rate": floor, **one}]))
    else:
        measured = measure(bench, settings)
        numpy = " (built from NumPy)" if args.from_numpy else ""
        epochs = f"1 warm-up + {settings['epochs']} timed epochs per run"
        print(f"\n{run.mode} run: batch {BATCH}, {settings['batches']} batches an epoch{numpy},")
        print(f"{epochs}, medians over {settings['rounds']} rounds")
        print(tables(measured["cases"]))
    fixed = {"batch_size": BATCH, "optimizer_params": OPTIMIZER_PARAMS, "depth": DEPTH}
    settings = {**fixed, "from_numpy": args.from_numpy, "target": TARGET, **settings}
    return run.finish(failures, settings, measured, correctness={"checked": bool(args.check)})
