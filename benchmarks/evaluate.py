"""mxoid's Evaluate against Module.score: the same metrics on the same iterator.

The MLP 784-128-64-10 (``SoftmaxOutput`` named ``softmax``), one parameter
set (trained for 8 batches of 50 by ``mxoid.MainLoop`` from the benchmark's
fixed initial parameters: accuracy about 0.6) shared by both contenders, 10000
synthetic MNIST-shaped samples in one ``NDArrayIter`` (no shuffling), batch 50
(the training batch size), 100 and 500, on one CPU.

- **mxoid**: ``Evaluate({'valid': iterator}, metrics)`` attached to a
  ``MainLoop`` holding the parameters (its training iterator has batch 50;
  Evaluate binds its own executors for each evaluation batch size, the
  training one too, once), and
  ``evaluate()`` called on it: the metrics are summed on the device, read
  back once per evaluation.
- **Module**: ``mx.mod.Module(symbol)``, ``bind(data_shapes=it.provide_data,
  label_shapes=it.provide_label, for_training=False)``, ``set_params(arg,
  aux)``, then ``mod.score(it, metrics)``: the stock metrics, updated on the
  host every batch.

- **floor**: no metric at all, each batch of the same iterator copied into a
  bound executor (``grad_req='null'``) and run forward: what any evaluator
  running bound executors over this iterator does at the least, so
  Module.score / floor is the most any such evaluator can gain over
  Module.score in that case.

Metrics: ``'acc'``, ``'ce'``, and both together. The three are timed call
after call in a rotating order, round after round; the table has the median
time per evaluation and the ratio Module.score / mxoid (the target is 1.5 or
more). The Python thread's CPU time per evaluation
(``time.thread_time()``) is in the JSON.

Usage::

    python benchmarks/evaluate.py            # full: about a minute
    python benchmarks/evaluate.py --quick    # under 30 s
    python benchmarks/evaluate.py --check    # correctness only, a few seconds

``--check`` exits with status 1 unless both give the same accuracy (and the
same cross-entropy within ``rtol=1e-5``); the sample count is a multiple of
the batch sizes, since Module.score counts the padded rows of a last batch.
Speed never changes the exit status.
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
from mxoid.extensions import Evaluate  # noqa: E402

NAME = "evaluate"
BATCHES = (50, 100, 500)
METRIC_SETS = (("acc",), ("ce",), ("acc", "ce"))
# metric -> (mxoid record, without the iterator's prefix; Module's name)
RECORDS = {"acc": ("accuracy", "accuracy"), "ce": ("cross_entropy", "cross-entropy")}
TRAIN_BATCH = 50
TRAINED_BATCHES = 8
TARGET = 1.5
CE_RTOL = 1e-5
MODES = {
    "full": {"samples": 10000, "rounds": 21},
    "quick": {"samples": 10000, "rounds": 7},
    "check": {"samples": 2000, "rounds": 1},
}


def trained_params(symbol, X, y):
    """(arg, aux) after a few batches of MainLoop training from the fixed initial parameters.

    Few enough that the accuracy is about 0.6 (one epoch reaches 1.0 on this easy
    data, which would make the equality of accuracies a weak check)."""
    train = mx.io.NDArrayIter(X, y, batch_size=TRAIN_BATCH, label_name="softmax_label")
    loop = mxoid.MainLoop(
        symbol,
        train,
        optimizer_params={"learning_rate": 0.05, "momentum": 0.9},
        arg_params={k: mx.nd.array(v) for k, v in contenders.initial_params("mlp").items()},
        extensions=[mxoid.FinishAfter(after_n_batches=TRAINED_BATCHES)],
    )
    loop.run()
    return loop.get_params()


class Case:
    """One batch size and metric set: the two contenders, ready to be called."""

    def __init__(self, symbol, X, y, arg, aux, batch: int, metrics: Sequence[str]) -> None:
        self.batch, self.metrics = batch, list(metrics)
        self.iterator = mx.io.NDArrayIter(
            X, y, batch_size=batch, shuffle=False, label_name="softmax_label"
        )
        train = mx.io.NDArrayIter(X, y, batch_size=TRAIN_BATCH, label_name="softmax_label")
        self.evaluation = Evaluate({"valid": self.iterator}, self.metrics)
        self.loop = mxoid.MainLoop(
            symbol,
            train,
            arg_params=arg,
            aux_params=aux,
            extensions=[mxoid.FinishAfter(after_n_epochs=1), self.evaluation],
        )
        self.module = mx.mod.Module(symbol, context=mx.cpu())
        self.module.bind(
            data_shapes=self.iterator.provide_data,
            label_shapes=self.iterator.provide_label,
            for_training=False,
        )
        self.module.set_params(arg, aux)
        metric = self.metrics[0] if len(self.metrics) == 1 else self.metrics
        self.floor = symbol.simple_bind(
            mx.cpu(), grad_req="null", data=(batch, 784), softmax_label=(batch,)
        )
        for name, value in arg.items():
            self.floor.arg_dict[name][:] = value
        self.calls = {
            "mxoid": self.evaluation.evaluate,
            "module": lambda: self.module.score(self.iterator, metric),
            "floor": self.forward_passes,
        }

    def forward_passes(self) -> None:
        """The floor: each batch copied into a bound executor and run forward, no metric.

        What any evaluator that runs a bound executor over this iterator does at
        the least; Module.score over it is the most an evaluator can gain here."""
        data = self.floor.arg_dict["data"]
        self.iterator.reset()
        for batch in self.iterator:
            batch.data[0].copyto(data)
            self.floor.forward(is_train=False)
        self.iterator.reset()

    def values(self) -> Dict[str, Dict[str, float]]:
        """metric -> value, for each contender."""
        mine = self.calls["mxoid"]()
        theirs = dict(self.calls["module"]())
        return {
            "mxoid": {m: float(mine[f"valid_{RECORDS[m][0]}"]) for m in self.metrics},
            "module": {m: float(theirs[RECORDS[m][1]]) for m in self.metrics},
        }

    def measure(self, kind: str) -> Dict[str, float]:
        mx.nd.waitall()
        wall0, cpu0 = time.perf_counter(), time.thread_time()
        self.calls[kind]()
        mx.nd.waitall()
        return {"wall": time.perf_counter() - wall0, "cpu": time.thread_time() - cpu0}


def describe(case: dict) -> str:
    return f"batch {case['batch_size']}, {' + '.join(case['metrics'])}"


def check_values(values: Dict[str, Dict[str, float]], samples: int, where: str) -> List[str]:
    failures = []
    for metric, theirs in values["module"].items():
        mine = values["mxoid"][metric]
        if not (np.isfinite(mine) and np.isfinite(theirs)):
            failures.append(f"{where}: {metric} not finite (mxoid {mine}, Module {theirs})")
        elif metric == "acc":
            if round(mine * samples) != round(theirs * samples) or abs(mine - theirs) > 1e-9:
                failures.append(f"{where}: accuracy mxoid {mine!r} != Module.score {theirs!r}")
        elif not np.isclose(mine, theirs, rtol=CE_RTOL, atol=0):
            failures.append(
                f"{where}: cross-entropy mxoid {mine!r} vs Module.score {theirs!r} "
                f"(beyond rtol {CE_RTOL})"
            )
    return failures


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = standalone.argument_parser(__doc__, NAME)
    args = parser.parse_args(argv)
    mode = standalone.mode_of(args)
    settings = MODES[mode]
    load = standalone.OtherLoad()

    samples = settings["samples"]
    symbol = contenders.build_symbol("mlp")
    X, y = contenders.make_data("mlp", samples)
    arg, aux = trained_params(symbol, X, y)
    cases = [
        Case(symbol, X, y, arg, aux, batch, metrics) for batch in BATCHES for metrics in METRIC_SETS
    ]
    assert all(samples % case.batch == 0 for case in cases)  # no padded rows to count

    failures: List[str] = []
    results = []
    for case in cases:
        values = case.values()  # also the warm-up call of each contender
        entry = {"batch_size": case.batch, "metrics": case.metrics, "values": values}
        failures += check_values(values, samples, describe(entry))
        results.append(entry)
    if args.check:
        print(
            "Correctness: "
            + (
                "Evaluate and Module.score give the same accuracy (cross-entropy within "
                f"rtol {CE_RTOL})"
                if not failures
                else "FAILED"
            )
        )
        for failure in failures:
            print(f"  {failure}")

    kinds = ("mxoid", "module", "floor")
    timings = {i: {kind: [] for kind in kinds} for i in range(len(cases))}
    for r in range(settings["rounds"]):
        for i, case in enumerate(cases):
            shift = (r + i) % len(kinds)
            for kind in kinds[shift:] + kinds[:shift]:
                timings[i][kind].append(case.measure(kind))
    for i, entry in enumerate(results):
        for kind, values in timings[i].items():
            wall = np.array([v["wall"] for v in values]) * 1e3
            cpu = np.array([v["cpu"] for v in values]) * 1e3
            entry[kind] = {
                "ms": float(np.median(wall)),
                "ms_min": float(wall.min()),
                "ms_max": float(wall.max()),
                "cpu_ms": float(np.median(cpu)),
                "wall_ms": wall.tolist(),
                "cpu_ms_list": cpu.tolist(),
            }
        per_round = [
            m["wall"] / x["wall"] for m, x in zip(timings[i]["module"], timings[i]["mxoid"])
        ]
        entry["ratio_module_over_mxoid"] = entry["module"]["ms"] / entry["mxoid"]["ms"]
        entry["cpu_ratio_module_over_mxoid"] = entry["module"]["cpu_ms"] / entry["mxoid"]["cpu_ms"]
        entry["ratio_per_round_median"] = float(np.median(per_round))
        entry["met"] = entry["ratio_module_over_mxoid"] >= TARGET
        entry["ratio_module_over_floor"] = entry["module"]["ms"] / entry["floor"]["ms"]
        entry["ratio_mxoid_over_floor"] = entry["mxoid"]["ms"] / entry["floor"]["ms"]

    print()
    print(
        f"{mode} run: MLP 784-128-64-10, {samples} samples, medians over "
        f"{settings['rounds']} rounds; x: Module.score / mxoid (target >= {TARGET})"
    )
    print(format_table(results))
    return standalone.finish(
        NAME,
        args,
        load,
        {
            "batch_sizes": BATCHES,
            "metric_sets": METRIC_SETS,
            "target": TARGET,
            **settings,
        },
        results,
        failures,
    )


def format_table(results: List[dict]) -> str:
    lines = [
        "| batch | metrics | value | mxoid Evaluate ms | Module.score ms | x (Module/mxoid) "
        "| floor ms | most possible x (Module/floor) | mxoid CPU ms | Module CPU ms |",
        "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        value = ", ".join(f"{m} {v:.4f}" for m, v in r["values"]["mxoid"].items())
        floor = r.get("floor")
        lines.append(
            f"| {r['batch_size']} | {' + '.join(r['metrics'])} | {value} "
            f"| {r['mxoid']['ms']:.1f} | {r['module']['ms']:.1f} "
            f"| {r['ratio_module_over_mxoid']:.2f} "
            f"| {floor['ms']:.1f} | {r['ratio_module_over_floor']:.2f} "
            if floor
            else "| - | - "
        )
        lines[-1] += f"| {r['mxoid']['cpu_ms']:.1f} | {r['module']['cpu_ms']:.1f} |"
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
