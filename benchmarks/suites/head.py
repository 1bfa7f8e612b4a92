"""The head suite: what TrainingMonitoring's metric head costs the engine, four ways.

Bound executors without a head, with it from MXNet's operators, with the fused values
and MXNet's sums (mxoid before ``mxoid_metric_sums``), and with the fused operator
alone, alternating round after round. ``--check``: bit-identical values and sums.
"""

import itertools
import os
import sys
import time
from typing import Dict, List, Optional, Sequence, Tuple

import mxnet as mx
import numpy as np
from harness import report, turns, workload

from mxoid.metrics import create_metrics, native, per_row_head
from suites.internals import COUNTING_SUFFIX

SUMS = "_mxoid_running_sums0"
COUNTING = SUMS + COUNTING_SUFFIX
KEYS = ("batches", "contexts", "steps", "rounds")  # steps: passes a measurement
SIZES = {"full": ((32, 128), (1, 2), 500, 30), "quick": ((32, 128), (1, 2), 200, 10)}
SIZES["check"] = ((32,), (1, 2), 3, 2)
STEPS_DIVIDED = {"mlp": 1, "lenet": 25}  # LeNet's step is about 50 times the MLP's
HEADS = ("MXNet's operators", "fused, backward sums", "fused operator")


def bind(model: str, symbol, batch: int, contexts: int, head) -> list:
    """One executor per context on its share of the batch, the model's parameters set."""
    rows = batch // contexts
    net = mx.sym.Group([symbol, head]) if head is not None else symbol
    names, init = workload.param_names(symbol), workload.initial_params(model)
    X, y = workload.make_data(model, batch)
    shape = (rows,) + workload.sample_shape(model)
    executors = []
    for k, context in enumerate(workload.contexts(contexts)):
        grad_req = {n: "write" if n in names else "null" for n in net.list_arguments()}
        if SUMS in grad_req:  # MXNet's operators: the backward pass adds to its gradient
            grad_req[SUMS] = "add"
        executor = net.simple_bind(context, grad_req=grad_req, data=shape, softmax_label=(rows,))
        for name in names:
            executor.arg_dict[name][:] = init[name]
        executor.arg_dict["data"][:] = X[k * rows : (k + 1) * rows]
        executor.arg_dict["softmax_label"][:] = y[k * rows : (k + 1) * rows]
        if head is not None:
            running_sums(executor)[:] = 0
        if COUNTING in executor.arg_dict:  # the fused operator adds while this is 1
            executor.arg_dict[COUNTING][:] = 1
        executors.append(executor)
    return executors


def running_sums(executor) -> mx.nd.NDArray:
    """The head's running sums: the fused operator's auxiliary state, or a gradient."""
    return executor.aux_dict[SUMS] if SUMS in executor.aux_dict else executor.grad_dict[SUMS]


def variants(batch: int, contexts: int, model: str) -> Dict[str, list]:
    symbol = workload.build_symbol(model)
    metrics = [("softmax", m) for m in create_metrics(["acc", "ce"])]
    rows = batch // contexts
    shapes = {"data": (rows,) + workload.sample_shape(model), "softmax_label": (rows,)}

    def head(fused: bool, sums: Optional[str] = SUMS):
        built = per_row_head(symbol, metrics, ["softmax_label"], shapes, [rows], sums, native=fused)
        assert ("mxoid_metric_sums" in built.tojson()) == (fused and sums is not None)
        return built

    values = head(True, None)  # mxoid before the summing operator: MXNet's sums
    assert "mxoid_metric_rows" in values.tojson()
    backward_sums = mx.sym.Group(
        [values, mx.sym.MakeLoss(mx.sym.var(SUMS, dtype="float64") * values)]
    )
    heads = {"no head": None, HEADS[0]: head(False), HEADS[1]: backward_sums, HEADS[2]: head(True)}
    return {name: bind(model, symbol, batch, contexts, h) for name, h in heads.items()}


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
    """The heads' values and running sums, compared bit for bit after the same passes."""
    failures = []
    for name in HEADS:
        passes(built[name], 2)
    for k, other in itertools.product(range(contexts), HEADS[1:]):
        ours, theirs = built[other][k], built[HEADS[0]][k]
        for what, a, b in (
            (f"{other}: values", ours.outputs[1], theirs.outputs[1]),
            (f"{other}: running sums", running_sums(ours), running_sums(theirs)),
        ):
            if not np.array_equal(a.asnumpy(), b.asnumpy()):
                failures.append(f"b{batch} {contexts} ctx, device {k}: the heads' {what} differ")
    return failures


def measure(model: str, batch: int, contexts: int, size: dict, failures: List[str]) -> List[dict]:
    """The variants alternating round after round; each one's median cost per batch, and
    the median of its differences to the variant without a head in the same round."""
    built = variants(batch, contexts, model)
    failures += check(batch, contexts, built)

    def one(name: str) -> Tuple[float, float]:
        return passes(built[name], size["steps"])

    times = turns.interleave(one, list(built), size["rounds"], turns.alternating)
    bare, results = 1e6 * np.asarray(times["no head"]), []
    for name, measured in times.items():
        measured = 1e6 * np.asarray(measured)  # (rounds, [wall, cpu])
        wall, cpu = np.median(measured, axis=0)
        head_wall, head_cpu = np.median(measured - bare, axis=0)
        entry = dict(model=model, batch=batch, contexts=contexts, variant=name)
        entry.update(us_per_batch=float(wall), head_us_per_batch=float(head_wall))
        results.append(
            {**entry, "cpu_us_per_batch": float(cpu), "head_cpu_us_per_batch": float(head_cpu)}
        )
    return results


COLUMNS = (
    ("cell", "{model} b{batch} {contexts} ctx"),
    ("head", "{variant}"),
    ("us/batch", "{us_per_batch:.1f}"),
    ("head us/batch", "{head_us_per_batch:+.1f}"),
    ("CPU us/batch", "{cpu_us_per_batch:.1f}"),
    ("head CPU us/batch", "{head_cpu_us_per_batch:+.1f}"),
)


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = report.parser(__doc__, "head")
    parser.add_argument("--model", choices=("mlp", "lenet"), default="mlp")
    parser.add_argument("--contexts", type=int, nargs="+", help="only these numbers of contexts")
    args = parser.parse_args(argv)
    run = report.Run("head", args, argv)
    size = dict(zip(KEYS, SIZES[run.mode]), model=args.model)
    size["steps"] = max(1, size["steps"] // STEPS_DIVIDED[args.model])
    size["contexts"] = tuple(args.contexts or size["contexts"])
    size["MXNET_CPU_PARALLEL_RAND_COPY"] = os.environ.get("MXNET_CPU_PARALLEL_RAND_COPY", "1")
    if not native.available():
        print(f"the fused operator is unavailable: {native.unavailable_reason()}")
        return run.finish(["no fused operator"], size, [])
    failures: List[str] = []
    results = []
    for batch, contexts in itertools.product(size["batches"], size["contexts"]):
        results += measure(args.model, batch, contexts, size, failures)
    print(report.table_of(COLUMNS, results, "llrrrr"))
    return run.finish(failures, size, results)
