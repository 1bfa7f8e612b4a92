"""What TrainingMonitoring's metric head costs the engine: MXNet's operators against the fused one.

The MLP 784-128-64-10 of ``run.py`` is bound with ``simple_bind``, one executor
per context (each batch split in halves on two), four ways: without a head;
with the head of accuracy and cross-entropy that TrainingMonitoring binds
(:func:`mxoid.metrics.per_row_head` with running sums) built from MXNet's
operators (``native=False``: the values, and the backward pass adds them to the
sums); with the fused operator for the values and MXNet's operators adding them up
in the backward pass (as mxoid did before ``mxoid_metric_sums``); and as
TrainingMonitoring binds it on one CPU, on mxoid's fused operator
(``mxoid.metrics.native``: one operator computes the values and adds them to the
sums in the forward pass; on two contexts too, whatever
``MXNET_CPU_PARALLEL_RAND_COPY`` says, to show what it costs there). A
measurement is ``steps`` forward and backward passes of every executor, then
``mx.nd.waitall()``: the wall time per batch, the engine doing all of the work,
and the process's CPU time per batch (every thread), less disturbed where the
machine's speed varies.
The variants alternate in order, round after round; the table has the median
per batch and the median over the rounds of each head's difference to the
variant without one in the same round.

Usage::

    python benchmarks/head.py            # full: a few minutes
    python benchmarks/head.py --quick    # under a minute
    python benchmarks/head.py --check    # correctness only, a few seconds
    python benchmarks/head.py --model lenet --contexts 2 --quick --json results/head-lenet.json

``--model lenet`` binds run.py's LeNet instead (a step about 50 times the MLP's: a
25th of the steps per measurement). ``--check`` asserts that the three heads give
the same values, bit for bit, and the same running sums. The exit status is 1 when
they do not, or when the fused operator cannot be built here; speed never changes it.
"""

from __future__ import annotations

import itertools
import os
import sys
import time
from typing import Dict, List, Optional, Sequence, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE), HERE]

import standalone  # noqa: E402, I001  (first: the thread settings, before MXNet is imported)

import contenders  # noqa: E402
import mxnet as mx  # noqa: E402
import numpy as np  # noqa: E402

from mxoid.private_heads import COUNTING_SUFFIX  # noqa: E402
from mxoid.metrics import create_metrics, native, per_row_head  # noqa: E402

NAME = "head"
SUMS = "_mxoid_running_sums0"
COUNTING = SUMS + COUNTING_SUFFIX
SIZES = {
    "full": {"batches": (32, 128), "contexts": (1, 2), "steps": 500, "rounds": 30},
    "quick": {"batches": (32, 128), "contexts": (1, 2), "steps": 200, "rounds": 10},
    "check": {"batches": (32,), "contexts": (1, 2), "steps": 3, "rounds": 2},
}
STEPS_DIVIDED = {"mlp": 1, "lenet": 25}
"""LeNet's step is about 50 times the MLP's: it takes fewer steps per measurement."""


def data_shape(model: str, rows: int) -> Tuple[int, ...]:
    return (rows, 784) if model == "mlp" else (rows, 1, 28, 28)


def bind(
    model: str,
    symbol: mx.sym.Symbol,
    batch: int,
    contexts: int,
    head: Optional[mx.sym.Symbol],
):
    """One executor per context on its share of the batch, the model's parameters set."""
    rows = batch // contexts
    net = mx.sym.Group([symbol, head]) if head is not None else symbol
    names = contenders.param_names(symbol)
    init = contenders.initial_params(model)
    X, y = contenders.make_data(model, batch)
    executors = []
    for k, context in enumerate(contenders.contexts(contexts)):
        grad_req = {n: "write" if n in names else "null" for n in net.list_arguments()}
        if SUMS in grad_req:  # MXNet's operators: the backward pass adds to its gradient
            grad_req[SUMS] = "add"
        executor = net.simple_bind(
            context, grad_req=grad_req, data=data_shape(model, rows), softmax_label=(rows,)
        )
        for name in names:
            executor.arg_dict[name][:] = init[name]
        executor.arg_dict["data"][:] = X[k * rows : (k + 1) * rows].reshape(data_shape(model, rows))
        executor.arg_dict["softmax_label"][:] = y[k * rows : (k + 1) * rows]
        if head is not None:
            running_sums(executor)[:] = 0
        if COUNTING in executor.arg_dict:  # the fused operator adds while this is 1
            executor.arg_dict[COUNTING][:] = 1
        executors.append(executor)
    return executors


def running_sums(executor: mx.executor.Executor) -> mx.nd.NDArray:
    """The head's running sums: the fused operator's auxiliary state, or a gradient."""
    return executor.aux_dict[SUMS] if SUMS in executor.aux_dict else executor.grad_dict[SUMS]


def variants(batch: int, contexts: int, model: str = "mlp") -> Dict[str, list]:
    symbol = contenders.build_symbol(model)
    metrics = [("softmax", m) for m in create_metrics(["acc", "ce"])]
    rows = batch // contexts
    shapes = {"data": data_shape(model, rows), "softmax_label": (rows,)}

    def head(fused: bool) -> mx.sym.Symbol:
        built = per_row_head(symbol, metrics, ["softmax_label"], shapes, [rows], SUMS, native=fused)
        assert ("mxoid_metric_sums" in built.tojson()) == fused
        return built

    def fused_values_backward_sums() -> mx.sym.Symbol:  # mxoid before the summing operator
        values = per_row_head(symbol, metrics, ["softmax_label"], shapes, [rows], native=True)
        assert "mxoid_metric_rows" in values.tojson()
        sums = mx.sym.var(SUMS, dtype="float64")
        return mx.sym.Group([values, mx.sym.MakeLoss(sums * values)])

    return {
        "no head": bind(model, symbol, batch, contexts, None),
        "MXNet's operators": bind(model, symbol, batch, contexts, head(False)),
        "fused, backward sums": bind(model, symbol, batch, contexts, fused_values_backward_sums()),
        "fused operator": bind(model, symbol, batch, contexts, head(True)),
    }


def passes(executors: list, steps: int) -> Tuple[float, float]:
    """Seconds per batch of ``steps`` forward and backward passes of every executor:
    wall-clock, and CPU time of the process (every thread: the engine's work)."""
    mx.nd.waitall()
    start, cpu = time.perf_counter(), time.process_time()
    for _ in range(steps):
        for executor in executors:
            executor.forward(is_train=True)
        for executor in executors:
            executor.backward()
    mx.nd.waitall()
    return (time.perf_counter() - start) / steps, (time.process_time() - cpu) / steps


def check(batch: int, contexts: int, built: Dict[str, list]) -> List[str]:
    """The two heads' values and running sums, compared bit for bit after the same passes."""
    failures = []
    for name in ("MXNet's operators", "fused, backward sums", "fused operator"):
        passes(built[name], 2)
    for k, other in itertools.product(range(contexts), ("fused, backward sums", "fused operator")):
        ours, theirs = built[other][k], built["MXNet's operators"][k]
        for what, a, b in (
            (f"{other}: values", ours.outputs[1], theirs.outputs[1]),
            (f"{other}: running sums", running_sums(ours), running_sums(theirs)),
        ):
            if not np.array_equal(a.asnumpy(), b.asnumpy()):
                failures.append(f"b{batch} {contexts} ctx, device {k}: the heads' {what} differ")
    return failures


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = standalone.argument_parser(__doc__, NAME)
    parser.add_argument("--model", choices=("mlp", "lenet"), default="mlp")
    parser.add_argument("--contexts", type=int, nargs="+", help="only these numbers of contexts")
    args = parser.parse_args(argv)
    mode = standalone.mode_of(args)
    size = dict(SIZES[mode], model=args.model)
    size["steps"] = max(1, size["steps"] // STEPS_DIVIDED[args.model])
    if args.contexts:
        size["contexts"] = tuple(args.contexts)
    load = standalone.OtherLoad()
    if not native.available():
        print(f"the fused operator is unavailable: {native.unavailable_reason()}")
        return standalone.finish(NAME, args, load, size, [], ["no fused operator"])
    results, failures = [], []
    for batch in size["batches"]:
        for contexts in size["contexts"]:
            built = variants(batch, contexts, args.model)
            failures += check(batch, contexts, built)
            times: Dict[str, List[Tuple[float, float]]] = {name: [] for name in built}
            for round_index in range(size["rounds"]):
                order = list(built) if round_index % 2 else list(built)[::-1]
                for name in order:
                    times[name].append(passes(built[name], size["steps"]))
            bare = np.asarray(times["no head"])
            for name, measured in times.items():
                measured = np.asarray(measured)  # (rounds, [wall, cpu])
                entry = {
                    "model": args.model,
                    "batch": batch,
                    "contexts": contexts,
                    "variant": name,
                    "us_per_batch": 1e6 * float(np.median(measured[:, 0])),
                    "head_us_per_batch": 1e6 * float(np.median(measured[:, 0] - bare[:, 0])),
                    "cpu_us_per_batch": 1e6 * float(np.median(measured[:, 1])),
                    "head_cpu_us_per_batch": 1e6 * float(np.median(measured[:, 1] - bare[:, 1])),
                }
                results.append(entry)
                print(
                    f"{args.model} b{batch} {contexts} ctx  {name:<20}"
                    f" {entry['us_per_batch']:8.1f} us/batch"
                    f"  head {entry['head_us_per_batch']:+7.1f}"
                    f"  CPU {entry['cpu_us_per_batch']:8.1f}"
                    f"  head {entry['head_cpu_us_per_batch']:+7.1f}"
                )
    settings = {
        **size,
        "MXNET_CPU_PARALLEL_RAND_COPY": os.environ.get("MXNET_CPU_PARALLEL_RAND_COPY", "1"),
    }
    return standalone.finish(NAME, args, load, settings, results, failures)


if __name__ == "__main__":
    sys.exit(main())
