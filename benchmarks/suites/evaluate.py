"""The evaluate suite: mxoid's Evaluate against Module.score, the same metrics and iterator.

The MLP at batch 50 (the training one), 100 and 500, metrics acc, ce and both, against
the floor (forward passes alone), rotating round after round; target: Module.score /
mxoid >= 1.5. ``--check``: the same accuracy (cross-entropy within ``rtol=1e-5``).
"""

import functools
import sys
import time
from typing import Dict, List, Optional, Sequence

import mxnet as mx
import numpy as np
from harness import report, turns, workload

import mxoid
from mxoid.extensions import Evaluate

BATCHES = (50, 100, 500)
METRIC_SETS = (("acc",), ("ce",), ("acc", "ce"))
RECORDS = {"acc": ("accuracy", "accuracy"), "ce": ("cross_entropy", "cross-entropy")}
TRAIN_BATCH, TRAINED_BATCHES, TARGET, CE_RTOL = 50, 8, 1.5, 1e-5
MODES = {"full": (10000, 21), "quick": (10000, 7), "check": (2000, 1)}  # samples, rounds
KINDS = ("mxoid", "module", "floor")


def trained_params(symbol, X, y):
    """(arg, aux) after a few batches of MainLoop training (accuracy about 0.6: one epoch
    reaches 1.0 on this easy data, which would make the equality a weak check)."""
    train = mx.io.NDArrayIter(X, y, batch_size=TRAIN_BATCH, label_name="softmax_label")
    init = {k: mx.nd.array(v) for k, v in workload.initial_params("mlp").items()}
    stop = [mxoid.FinishAfter(after_n_batches=TRAINED_BATCHES)]
    options = dict(optimizer_params={"learning_rate": 0.05, "momentum": 0.9}, extensions=stop)
    loop = mxoid.MainLoop(symbol, train, arg_params=init, **options)
    loop.run()
    return loop.get_params()


class Case:
    """One batch size and metric set: the three contenders, ready to be called."""

    def __init__(self, symbol, X, y, arg, aux, batch: int, metrics: Sequence[str]) -> None:
        self.batch, self.metrics = batch, list(metrics)
        label = "softmax_label"
        iterator = mx.io.NDArrayIter(X, y, batch_size=batch, shuffle=False, label_name=label)
        train = mx.io.NDArrayIter(X, y, batch_size=TRAIN_BATCH, label_name=label)
        self.iterator, self.evaluation = iterator, Evaluate({"valid": iterator}, self.metrics)
        extensions = [mxoid.FinishAfter(after_n_epochs=1), self.evaluation]
        self.loop = mxoid.MainLoop(
            symbol, train, arg_params=arg, aux_params=aux, extensions=extensions
        )
        self.module = mx.mod.Module(symbol, context=mx.cpu())
        shapes = dict(data_shapes=iterator.provide_data, label_shapes=iterator.provide_label)
        self.module.bind(for_training=False, **shapes)
        self.module.set_params(arg, aux)
        metric = self.metrics[0] if len(self.metrics) == 1 else self.metrics
        shapes = dict(data=(batch, 784), softmax_label=(batch,))
        self.floor = symbol.simple_bind(mx.cpu(), grad_req="null", **shapes)
        for name, value in arg.items():
            self.floor.arg_dict[name][:] = value
        self.calls = {"mxoid": self.evaluation.evaluate, "floor": self.forward_passes}
        self.calls["module"] = functools.partial(self.module.score, self.iterator, metric)

    def forward_passes(self) -> None:
        data = self.floor.arg_dict["data"]
        self.iterator.reset()
        for batch in self.iterator:
            batch.data[0].copyto(data)
            self.floor.forward(is_train=False)
        self.iterator.reset()

    def values(self) -> Dict[str, Dict[str, float]]:
        """metric -> value, for mxoid and Module."""
        mine, theirs = self.calls["mxoid"](), dict(self.calls["module"]())
        values = {"mxoid": {m: float(mine[f"valid_{RECORDS[m][0]}"]) for m in self.metrics}}
        return {**values, "module": {m: float(theirs[RECORDS[m][1]]) for m in self.metrics}}

    def measure(self, kind: str) -> Dict[str, float]:
        mx.nd.waitall()
        wall0, cpu0 = time.perf_counter(), time.thread_time()
        self.calls[kind]()
        mx.nd.waitall()
        return {"wall": time.perf_counter() - wall0, "cpu": time.thread_time() - cpu0}


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
            text = f"cross-entropy mxoid {mine!r} vs Module.score {theirs!r}"
            failures.append(f"{where}: {text} (beyond rtol {CE_RTOL})")
    return failures


def timings(entry: dict, measured: Dict[str, List[dict]]) -> None:
    """Give a case's entry its contenders' times (ms, medians) and ratios."""
    for kind, values in measured.items():
        wall = np.array([v["wall"] for v in values]) * 1e3
        cpu = np.array([v["cpu"] for v in values]) * 1e3
        times = dict(ms=float(np.median(wall)), ms_min=float(wall.min()), ms_max=float(wall.max()))
        entry[kind] = {**times, "cpu_ms": float(np.median(cpu)), "wall_ms": wall.tolist()}
        entry[kind]["cpu_ms_list"] = cpu.tolist()
    per_round = [m["wall"] / x["wall"] for m, x in zip(measured["module"], measured["mxoid"])]
    mxoid_ms, module_ms, floor_ms = (entry[k]["ms"] for k in KINDS)
    entry["ratio_module_over_mxoid"] = module_ms / mxoid_ms
    entry["cpu_ratio_module_over_mxoid"] = entry["module"]["cpu_ms"] / entry["mxoid"]["cpu_ms"]
    entry["ratio_per_round_median"] = float(np.median(per_round))
    entry["met"] = entry["ratio_module_over_mxoid"] >= TARGET
    entry["ratio_module_over_floor"] = module_ms / floor_ms
    entry["ratio_mxoid_over_floor"] = mxoid_ms / floor_ms


COLUMNS = (
    ("batch", "{batch_size}"),
    ("metrics", "{names}"),
    ("value", "{value}"),
    ("mxoid Evaluate ms", "{mxoid[ms]:.1f}"),
    ("Module.score ms", "{module[ms]:.1f}"),
    ("x (Module/mxoid)", "{ratio_module_over_mxoid:.2f}"),
    ("floor ms", "{floor[ms]:.1f}"),
    ("most possible x (Module/floor)", "{ratio_module_over_floor:.2f}"),
    ("mxoid CPU ms", "{mxoid[cpu_ms]:.1f}"),
    ("Module CPU ms", "{module[cpu_ms]:.1f}"),
)


def table(results: List[dict]) -> str:
    entries = []
    for r in results:
        value = ", ".join(f"{m} {v:.4f}" for m, v in r["values"]["mxoid"].items())
        entries.append({**r, "names": " + ".join(r["metrics"]), "value": value})
    return report.table_of(COLUMNS, entries, "rllrrrrrrr")


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = report.parser(__doc__, "evaluate").parse_args(argv)
    run = report.Run("evaluate", args, argv)
    settings = dict(zip(("samples", "rounds"), MODES[run.mode]))
    samples, symbol = settings["samples"], workload.build_symbol("mlp")
    X, y = workload.make_data("mlp", samples)
    arg, aux = trained_params(symbol, X, y)
    cases = [Case(symbol, X, y, arg, aux, b, metrics) for b in BATCHES for metrics in METRIC_SETS]
    assert all(samples % case.batch == 0 for case in cases)  # Module.score counts padded rows
    failures, results = [], []
    for case in cases:
        entry = {"batch_size": case.batch, "metrics": case.metrics, "values": case.values()}
        where = f"batch {case.batch}, {' + '.join(case.metrics)}"
        failures += check_values(entry["values"], samples, where)
        results.append(entry)  # values(): also the warm-up call of mxoid and Module
    measured = [{kind: [] for kind in KINDS} for _ in cases]
    for r in range(settings["rounds"]):  # every case in each round, its order rotating
        for i, case in enumerate(cases):
            for kind in turns.rotation(KINDS, r + i):
                measured[i][kind].append(case.measure(kind))
    for entry, times in zip(results, measured):
        timings(entry, times)
    print(f"\n{run.mode} run: MLP, {samples} samples, medians over {settings['rounds']} rounds;")
    print(f"x: Module.score / mxoid (target >= {TARGET})")
    print(table(results))
    settings = {"batch_sizes": BATCHES, "metric_sets": METRIC_SETS, "target": TARGET, **settings}
    return run.finish(failures, settings, results)
