"""Training throughput with a slow Python iterator, with and without mxoid.data.Prefetch.

The iterator is an ``mx.io.DataIter`` subclass over an MLP-sized synthetic
data set (784 features, 10 classes, batch 64) that sleeps ``S`` seconds per
batch before building it (``time.sleep`` lets go of the interpreter lock, as
decoding in C or reading a file does). The network is the MLP 784-128-64-10
(``SoftmaxOutput`` named ``softmax``), trained by ``mxoid.MainLoop`` on one
CPU with ``optimizer_params={'learning_rate': 0.05, 'momentum': 0.9}`` and
``FinishAfter(after_n_epochs=...)``.

Measured, in one process, the contenders interleaved round after round:

- ``data``: the slow iterator alone, read through, no training;
- ``compute``: the same training on an ``NDArrayIter`` of the same data, no sleep;
- ``plain``: training on the slow iterator;
- ``prefetch``: training on ``Prefetch(slow_iterator, depth=2)``.

``S`` is set from the compute rate measured first: the compute time per
batch, less what the iterator costs over its sleep (measured once at that
sleep: oversleeping, building the batch), so that the data and compute rates
are comparable; and ``2 S``. With perfect
overlap the prefetched loop runs at ``min(data rate, compute rate)``; the
table gives its ratio to that (the target is 0.9 or more). A run's throughput
is its median epoch (a warm-up epoch first, every epoch timed to after
``mx.nd.waitall()``); a contender's, the median over the rounds.

Usage::

    python benchmarks/prefetch.py            # full: about 2 minutes
    python benchmarks/prefetch.py --quick    # under 30 s
    python benchmarks/prefetch.py --check    # correctness only, a few seconds

``--check`` trains with a tiny sleep, without and with Prefetch, and exits
with status 1 unless both end with bit-identical parameters
(``loop.get_params()``); speed never changes the exit status.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Dict, List, Optional, Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE), HERE]

import standalone  # noqa: E402, I001  (first: the thread settings, before MXNet is imported)

import contenders  # noqa: E402  (the benchmark's MLP, data and initial parameters)
import mxnet as mx  # noqa: E402
import numpy as np  # noqa: E402

import mxoid  # noqa: E402
from mxoid.data import Prefetch  # noqa: E402

NAME = "prefetch"
BATCH = 64
OPTIMIZER_PARAMS = {"learning_rate": 0.05, "momentum": 0.9}
DEPTH = 2
MODES = {
    "full": {"batches": 150, "epochs": 4, "rounds": 5, "calibration_runs": 5},
    "quick": {"batches": 80, "epochs": 2, "rounds": 3, "calibration_runs": 4},
    "check": {"batches": 8, "epochs": 2, "rounds": 0, "calibration_runs": 0, "sleep": 0.0005},
}
TARGET = 0.9
LABELS = {
    "data": "data alone (slow iterator, no training)",
    "compute": "compute alone (NDArrayIter, no sleep)",
    "plain": "training on the slow iterator",
    "prefetch": f"training on Prefetch(slow iterator, depth={DEPTH})",
}


class SlowIter(mx.io.DataIter):
    """Batches of ``(X, y)`` in order, each after ``time.sleep(seconds)``: slow reading.

    A batch is a slice of the data set, already in NDArrays (as ``NDArrayIter``
    gives it), so that the sleep is nearly all its cost; with ``from_numpy``,
    it is built from NumPy with ``mx.nd.array`` (about 0.25 ms of host work per
    batch here, partly holding the interpreter lock).
    """

    def __init__(
        self,
        X: np.ndarray,
        y: np.ndarray,
        batch_size: int,
        seconds: float,
        from_numpy: bool = False,
    ) -> None:
        super().__init__(batch_size)
        self.seconds, self.from_numpy = seconds, from_numpy
        self.X, self.y = (X, y) if from_numpy else (mx.nd.array(X), mx.nd.array(y))
        self.count = len(X)
        self.cursor = 0
        self._provide_data = [mx.io.DataDesc("data", (batch_size,) + X.shape[1:])]
        self._provide_label = [mx.io.DataDesc("softmax_label", (batch_size,))]

    @property
    def provide_data(self):
        return self._provide_data

    @property
    def provide_label(self):
        return self._provide_label

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
        return mx.io.DataBatch(
            data=[data],
            label=[label],
            pad=0,
            provide_data=self._provide_data,
            provide_label=self._provide_label,
        )


class Bench:
    """The data set, the network and the initial parameters every run starts from."""

    def __init__(self, batches: int, from_numpy: bool = False) -> None:
        self.batches, self.from_numpy = batches, from_numpy
        self.X, self.y = contenders.make_data("mlp", batches * BATCH)
        self.init = contenders.initial_params("mlp")
        self.symbol = contenders.build_symbol("mlp")

    def iterator(self, kind: str, seconds: float = 0.0) -> mx.io.DataIter:
        if kind == "compute":
            return mx.io.NDArrayIter(
                self.X, self.y, batch_size=BATCH, shuffle=False, label_name="softmax_label"
            )
        slow = SlowIter(self.X, self.y, BATCH, seconds, self.from_numpy)
        return Prefetch(slow, depth=DEPTH) if kind == "prefetch" else slow

    def train(self, iterator: mx.io.DataIter, epochs: int):
        """Train 1 warm-up + ``epochs`` epochs; return (the loop, seconds per timed epoch)."""
        clock = contenders.EpochClock()
        loop = mxoid.MainLoop(
            self.symbol,
            iterator,
            optimizer_params=dict(OPTIMIZER_PARAMS),
            arg_params={k: mx.nd.array(v) for k, v in self.init.items()},
            extensions=[
                mxoid.FinishAfter(after_n_epochs=1 + epochs),
                contenders._clock_extension(clock),
            ],
        )
        clock.tick()
        loop.run()
        return loop, np.diff(clock.stamps)[1:]

    def read(self, iterator: mx.io.DataIter, epochs: int) -> np.ndarray:
        """Read 1 warm-up + ``epochs`` epochs without training; seconds per timed epoch."""
        stamps = []  # the first is the end of the warm-up epoch
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
            _, epoch_seconds = self.train(iterator, epochs)
        rates = self.batches / epoch_seconds
        return {"batches_per_second": float(np.median(rates)), "epoch_rates": rates.tolist()}


# ------------------------------------------------------------------ correctness
def check(bench: Bench, seconds: float, epochs: int) -> List[str]:
    failures = []
    params = {}
    iterations = {}
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
    init = bench.init["fc1_weight"]
    if np.array_equal(params["plain"]["fc1_weight"], init):
        failures.append("training did not change fc1_weight: the comparison would be vacuous")
    if not all(np.isfinite(v).all() for v in params["prefetch"].values()):
        failures.append("non-finite parameters")
    return failures


# ------------------------------------------------------------------ timing
def summarize(runs: List[Dict[str, object]]) -> Dict[str, object]:
    rates = [r["batches_per_second"] for r in runs]
    return {
        "batches_per_second": float(np.median(rates)),
        "min": float(np.min(rates)),
        "max": float(np.max(rates)),
        "runs": runs,
    }


def measure(bench: Bench, settings: dict, quiet: bool) -> dict:
    epochs = settings["epochs"]
    # Compute first: it sets the sleep. The first run is a warm-up.
    calibration = [bench.rate("compute", 0.0, epochs) for _ in range(settings["calibration_runs"])]
    compute_rate = float(np.median([r["batches_per_second"] for r in calibration[1:]]))
    compute_seconds = 1.0 / compute_rate
    # The iterator costs more than its sleep (the sleep oversleeps; building the batch):
    # one correction, so that the data rate at S is about the compute rate.
    probe = bench.rate("data", compute_seconds, epochs)["batches_per_second"]
    overhead = 1.0 / probe - compute_seconds
    base = round(max(1e-4, compute_seconds - overhead), 4)  # to 0.1 ms
    sleeps = {"S": base, "2S": 2 * base}
    if not quiet:
        print(
            f"compute alone (calibration): {compute_rate:.0f} batches/s, "
            f"{1e3 * compute_seconds:.2f} ms per batch; the slow iterator costs "
            f"{1e3 * overhead:.2f} ms per batch over its sleep -> S = {1e3 * base:.1f} ms",
            flush=True,
        )
    jobs = [("compute", None)] + [
        (kind, case) for case in sleeps for kind in ("data", "plain", "prefetch")
    ]
    runs: Dict[tuple, List[dict]] = {job: [] for job in jobs}
    for r in range(settings["rounds"]):
        shift = r % len(jobs)
        for job in jobs[shift:] + jobs[:shift]:  # rotate the order round after round
            kind, case = job
            runs[job].append(bench.rate(kind, sleeps[case] if case else 0.0, epochs))
        if not quiet:
            print(
                f"round {r + 1}/{settings['rounds']}: "
                + ", ".join(
                    f"{kind}{'' if case is None else ' ' + case} "
                    f"{runs[(kind, case)][-1]['batches_per_second']:.0f}"
                    for kind, case in jobs
                )
                + " batches/s",
                flush=True,
            )
    compute = summarize(runs[("compute", None)])
    cases = []
    for case, seconds in sleeps.items():
        data = summarize(runs[("data", case)])
        plain = summarize(runs[("plain", case)])
        prefetch = summarize(runs[("prefetch", case)])
        floor = min(data["batches_per_second"], compute["batches_per_second"])
        serial = 1.0 / (1.0 / data["batches_per_second"] + 1.0 / compute["batches_per_second"])
        per_round = [
            p["batches_per_second"] / min(d["batches_per_second"], c["batches_per_second"])
            for p, d, c in zip(prefetch["runs"], data["runs"], compute["runs"])
        ]
        cases.append(
            {
                "case": case,
                "sleep_seconds": seconds,
                "data": data,
                "compute": compute,
                "plain": plain,
                "prefetch": prefetch,
                "min_rate": floor,
                "serial_rate": serial,
                "prefetch_over_min_rate": prefetch["batches_per_second"] / floor,
                "plain_over_min_rate": plain["batches_per_second"] / floor,
                "prefetch_over_plain": prefetch["batches_per_second"] / plain["batches_per_second"],
                "prefetch_over_min_rate_per_round_median": float(np.median(per_round)),
                "target": TARGET,
                "met": prefetch["batches_per_second"] / floor >= TARGET,
            }
        )
    return {
        "calibration": calibration,
        "compute_rate_calibration": compute_rate,
        "iterator_overhead_seconds": overhead,
        "sleeps": sleeps,
        "cases": cases,
    }


def format_table(cases: List[dict]) -> str:
    lines = [
        "| sleep per batch | contender | batches/s | ms/batch | min-max | x min(data, compute) |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for case in cases:
        floor = case["min_rate"]
        sleep = f"{case['case']} = {1e3 * case['sleep_seconds']:.1f} ms"
        for kind in ("data", "compute", "plain", "prefetch"):
            entry = case[kind]
            rate = entry["batches_per_second"]
            lines.append(
                f"| {sleep} | {LABELS[kind]} | {rate:,.0f} | {1e3 / rate:.2f} "
                f"| {entry['min']:,.0f}-{entry['max']:,.0f} | {rate / floor:.2f} |"
            )
    return "\n".join(lines)


def format_summary(cases: List[dict]) -> str:
    lines = [
        "| sleep per batch | min(data, compute) | no overlap (serial) | plain | Prefetch "
        f"| Prefetch / min rate (target >= {TARGET}) | Prefetch / plain |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for case in cases:
        lines.append(
            f"| {case['case']} = {1e3 * case['sleep_seconds']:.1f} ms | {case['min_rate']:,.0f} "
            f"| {case['serial_rate']:,.0f} | {case['plain']['batches_per_second']:,.0f} "
            f"| {case['prefetch']['batches_per_second']:,.0f} "
            f"| {case['prefetch_over_min_rate']:.2f} ({'met' if case['met'] else 'not met'}) "
            f"| {case['prefetch_over_plain']:.2f} |"
        )
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = standalone.argument_parser(__doc__, NAME)
    parser.add_argument(
        "--from-numpy",
        action="store_true",
        help="build each batch with mx.nd.array from NumPy (host work besides the sleep)",
    )
    args = parser.parse_args(argv)
    mode = standalone.mode_of(args)
    settings = MODES[mode]
    load = standalone.OtherLoad()
    bench = Bench(settings["batches"], args.from_numpy)

    failures: List[str] = []
    measured = None
    if args.check:
        failures = check(bench, settings["sleep"], settings["epochs"])
        print(
            "Correctness: "
            + (
                "training with Prefetch ends with parameters bit-identical to training without"
                if not failures
                else "FAILED"
            )
        )
        for failure in failures:
            print(f"  {failure}")
        # The reporting path, on numbers of no meaning (one tiny run each).
        runs = {k: [bench.rate(k, settings["sleep"], 1)] for k in LABELS}
        one = {k: summarize(v) for k, v in runs.items()}
        floor = min(one["data"]["batches_per_second"], one["compute"]["batches_per_second"])
        case = {"case": "S", "sleep_seconds": settings["sleep"], "min_rate": floor, **one}
        print(format_table([case]))
    else:
        measured = measure(bench, settings, quiet=False)
        print()
        print(
            f"{mode} run: MLP 784-128-64-10, batch {BATCH}, {settings['batches']} batches per "
            f"epoch{' (built from NumPy)' if args.from_numpy else ''}, 1 warm-up + "
            f"{settings['epochs']} timed epochs per run, medians over "
            f"{settings['rounds']} rounds"
        )
        print(format_table(measured["cases"]))
        print()
        print(format_summary(measured["cases"]))

    return standalone.finish(
        NAME,
        args,
        load,
        {
            "batch_size": BATCH,
            "optimizer_params": OPTIMIZER_PARAMS,
            "depth": DEPTH,
            "from_numpy": args.from_numpy,
            "target": TARGET,
            **settings,
        },
        measured,
        failures,
        checked=bool(args.check),
    )


if __name__ == "__main__":
    sys.exit(main())
