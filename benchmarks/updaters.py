"""Per-step cost of MXNet's stock updater against mxoid's FusedUpdater.

Both updaters are called as the training loop calls them, once per step with
the lists of one device's parameters: ``updater(indices, grads, weights)`` on
``mx.cpu()``. The stock updater is ``mx.optimizer.get_updater(optimizer)``
(for SGD, its multi-tensor ``multi_sgd_update`` / ``multi_sgd_mom_update``
path); the fused one is ``mxoid.fused_updater.FusedUpdater(optimizer)`` (one
fused kernel per parameter, its multipliers and keywords worked out once).
Each contender has its own optimizer, weights and states, built alike.

Optimizers: SGD without momentum, SGD with momentum 0.9, NAG with momentum
0.9, Adam; learning rate 0.01, ``wd=1e-4``, ``rescale_grad=1/32``, parameter
names given (``param_idx2name``) so that biases get no weight decay, as in
Module and mxoid. Parameter sets: the MLP 784-128-64-10 (6 arrays), and 10,
50, 100 and 200 arrays of shape (16, 16).

A measurement is ``steps`` calls in a row, then ``mx.nd.waitall()``: the wall
time per step (host work and the kernels) and the Python thread's CPU time per
step (``time.thread_time()``, the host work alone: the kernels run on MXNet's
engine thread). The two updaters are measured in alternating order, round
after round; the table has the median over the rounds and the ratio stock /
fused (above 1: the fused updater is faster).

Usage::

    python benchmarks/updaters.py            # full: about 2 minutes
    python benchmarks/updaters.py --quick    # under 30 s
    python benchmarks/updaters.py --check    # correctness only, a few seconds

``--check`` asserts that the fused and the stock updater agree step by step:
bit-identical weights and states for SGD with momentum, NAG and Adam; within
``rtol=1e-6`` per step for plain SGD (``sgd_update`` rounds differently from
``multi_sgd_update``). The exit status is 1 when they do not; speed never
changes it.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Dict, List, Optional, Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE), HERE]

import standalone  # noqa: E402, I001  (first: the thread settings, before MXNet is imported)

import mxnet as mx  # noqa: E402
import numpy as np  # noqa: E402

from mxoid.fused_updater import FusedUpdater, fused_kernel  # noqa: E402

NAME = "updaters"
OPTIMIZERS = {
    "sgd": ("sgd", {}),
    "sgd_mom": ("sgd", {"momentum": 0.9}),
    "nag": ("nag", {"momentum": 0.9}),
    "adam": ("adam", {}),
}
LABELS = {
    "sgd": "SGD",
    "sgd_mom": "SGD mom 0.9",
    "nag": "NAG mom 0.9",
    "adam": "Adam",
}
COMMON = {"learning_rate": 0.01, "wd": 1e-4, "rescale_grad": 1.0 / 32}
BIT_IDENTICAL = ("sgd_mom", "nag", "adam")
SGD_RTOL = 1e-6
MLP = [
    ("fc1_weight", (128, 784)),
    ("fc1_bias", (128,)),
    ("fc2_weight", (64, 128)),
    ("fc2_bias", (64,)),
    ("fc3_weight", (10, 64)),
    ("fc3_bias", (10,)),
]
SWEEP = (10, 50, 100, 200)
MODES = {
    # seconds per measurement (steps are calibrated to it), rounds per case
    "full": {"target": 0.25, "rounds": 11, "sets": ["mlp"] + [f"sweep{n}" for n in SWEEP]},
    "quick": {"target": 0.06, "rounds": 5, "sets": ["mlp"] + [f"sweep{n}" for n in SWEEP]},
    "check": {"target": 0.005, "rounds": 1, "sets": ["mlp", "sweep10"]},
}
CHECK_STEPS = 6


def param_set(name: str) -> List[tuple]:
    """(name, shape) of each array of a parameter set."""
    if name == "mlp":
        return list(MLP)
    count = int(name[len("sweep") :])
    return [(f"p{i}_weight", (16, 16)) for i in range(count)]


def describe_set(name: str) -> str:
    return "MLP (6 arrays)" if name == "mlp" else f"{name[len('sweep') :]} x (16,16)"


class Contender:
    """One updater with its own optimizer, weights, gradients and states."""

    def __init__(self, kind: str, optimizer_key: str, arrays: List[tuple], seed: int = 0) -> None:
        name, extra = OPTIMIZERS[optimizer_key]
        self.optimizer = mx.optimizer.create(
            name,
            param_idx2name={i: n for i, (n, _) in enumerate(arrays)},
            **COMMON,
            **extra,
        )
        self.kind = kind
        self.updater = (
            mx.optimizer.get_updater(self.optimizer)
            if kind == "stock"
            else FusedUpdater(self.optimizer)
        )
        rng = np.random.RandomState(seed)
        self.indices = list(range(len(arrays)))
        self.weights = [mx.nd.array(rng.uniform(-0.5, 0.5, s)) for _, s in arrays]
        self.grads = [mx.nd.array(rng.standard_normal(s)) for _, s in arrays]

    def step(self) -> None:
        self.updater(self.indices, self.grads, self.weights)

    def measure(self, steps: int) -> Dict[str, float]:
        """Seconds per step: wall (after waitall) and the Python thread's CPU time."""
        update, indices, grads, weights = self.updater, self.indices, self.grads, self.weights
        mx.nd.waitall()
        wall0, cpu0 = time.perf_counter(), time.thread_time()
        for _ in range(steps):
            update(indices, grads, weights)
        cpu1 = time.thread_time()
        mx.nd.waitall()
        wall1 = time.perf_counter()
        return {"wall": (wall1 - wall0) / steps, "cpu": (cpu1 - cpu0) / steps}


# ------------------------------------------------------------------ correctness
def _states(updater) -> List[np.ndarray]:
    out: List[np.ndarray] = []

    def flatten(state) -> None:
        if state is None:
            return
        if isinstance(state, (list, tuple)):
            for part in state:
                flatten(part)
        else:
            out.append(state.asnumpy())

    for key in sorted(updater.states):
        flatten(updater.states[key])
    return out


def check_case(optimizer_key: str, set_name: str) -> dict:
    """Step both updaters on the same fresh gradients; return the disagreements found
    (``failures``) and, for plain SGD, the largest relative difference of a step."""
    arrays = param_set(set_name)
    stock = Contender("stock", optimizer_key, arrays)
    fused = Contender("fused", optimizer_key, arrays)
    failures = []
    worst_relative = [0.0]
    if fused_kernel(fused.optimizer) is None:
        failures.append(f"{optimizer_key}: FusedUpdater takes the stock path")
    rng = np.random.RandomState(1)
    where = f"{LABELS[optimizer_key]}, {describe_set(set_name)}"
    for step in range(1, CHECK_STEPS + 1):
        before = [w.asnumpy() for w in stock.weights]
        new_grads = [rng.standard_normal(s).astype(np.float32) for _, s in arrays]
        for contender in (stock, fused):
            for grad, value in zip(contender.grads, new_grads):
                grad[:] = value
            contender.step()
        ws = [w.asnumpy() for w in stock.weights]
        wf = [w.asnumpy() for w in fused.weights]
        if optimizer_key in BIT_IDENTICAL:
            same = all(np.array_equal(a, b) for a, b in zip(ws, wf))
            states = all(
                np.array_equal(a, b) for a, b in zip(_states(stock.updater), _states(fused.updater))
            )
            if not same or not states:
                worst = max(float(np.abs(a - b).max()) for a, b in zip(ws, wf))
                failures.append(
                    f"{where}, step {step}: not bit-identical "
                    f"(weights equal: {same}, states equal: {states}, max |diff| {worst:.3g})"
                )
                break
        else:
            # Relative to the magnitudes the step computes with (the weight before and
            # after): a weight that lands near zero keeps the rounding error of its terms.
            worst = max(
                float((np.abs(b - a) / np.maximum(np.maximum(np.abs(a), np.abs(w)), 1e-30)).max())
                for a, b, w in zip(ws, wf, before)
            )
            worst_relative[0] = max(worst_relative[0], worst)
            if worst > SGD_RTOL:
                failures.append(
                    f"{where}, step {step}: relative difference {worst:.3g} > {SGD_RTOL}"
                )
                break
            for weight, value in zip(fused.weights, ws):  # per step: start alike again
                weight[:] = value
    if not np.isfinite(np.concatenate([w.asnumpy().ravel() for w in fused.weights])).all():
        failures.append(f"{where}: non-finite weights")
    return {
        "optimizer": optimizer_key,
        "param_set": set_name,
        "steps": CHECK_STEPS,
        "compared": "bit-identical" if optimizer_key in BIT_IDENTICAL else f"rtol {SGD_RTOL}",
        "max_relative_difference": None if optimizer_key in BIT_IDENTICAL else worst_relative[0],
        "failures": failures,
    }


# ------------------------------------------------------------------ timing
def time_case(optimizer_key: str, set_name: str, target: float, rounds: int) -> dict:
    arrays = param_set(set_name)
    contenders = {kind: Contender(kind, optimizer_key, arrays) for kind in ("stock", "fused")}
    for contender in contenders.values():  # states created, kernels warmed
        for _ in range(3):
            contender.step()
    # The same number of steps for both: enough for `target` seconds of the slower one.
    probe = max(c.measure(5)["wall"] for c in contenders.values())
    steps = max(5, int(target / max(probe, 1e-6)))
    samples: Dict[str, List[Dict[str, float]]] = {kind: [] for kind in contenders}
    order = ["stock", "fused"]
    for r in range(rounds):
        for kind in order if r % 2 == 0 else order[::-1]:
            samples[kind].append(contenders[kind].measure(steps))
    result = {
        "optimizer": optimizer_key,
        "label": LABELS[optimizer_key],
        "param_set": set_name,
        "arrays": len(arrays),
        "parameters": int(sum(np.prod(s) for _, s in arrays)),
        "steps_per_measurement": steps,
        "rounds": rounds,
        "kernel": fused_kernel(contenders["fused"].optimizer),
    }
    for kind, values in samples.items():
        wall = np.array([v["wall"] for v in values]) * 1e6
        cpu = np.array([v["cpu"] for v in values]) * 1e6
        result[kind] = {
            "us_per_step": float(np.median(wall)),
            "us_per_step_min": float(wall.min()),
            "us_per_step_max": float(wall.max()),
            "cpu_us_per_step": float(np.median(cpu)),
            "us_per_array": float(np.median(wall)) / len(arrays),
            "cpu_us_per_array": float(np.median(cpu)) / len(arrays),
            "wall_us": wall.tolist(),
            "cpu_us": cpu.tolist(),
        }
    # Ratio per round (both measured back to back), then the median; and of the medians.
    per_round = [s["wall"] / f["wall"] for s, f in zip(samples["stock"], samples["fused"])]
    per_round_cpu = [s["cpu"] / f["cpu"] for s, f in zip(samples["stock"], samples["fused"])]
    result["ratio_stock_over_fused"] = (
        result["stock"]["us_per_step"] / result["fused"]["us_per_step"]
    )
    result["cpu_ratio_stock_over_fused"] = (
        result["stock"]["cpu_us_per_step"] / result["fused"]["cpu_us_per_step"]
    )
    result["ratio_per_round_median"] = float(np.median(per_round))
    result["cpu_ratio_per_round_median"] = float(np.median(per_round_cpu))
    return result


def format_table(results: List[dict]) -> str:
    header = (
        "| optimizer | parameters | stock us/step | fused us/step | x (stock/fused) "
        "| stock us/array | fused us/array | stock CPU us/step | fused CPU us/step "
        "| CPU x (stock/fused) |"
    )
    lines = [header, "|---|---|" + "---:|" * 8]
    for r in results:
        s, f = r["stock"], r["fused"]
        lines.append(
            f"| {r['label']} | {describe_set(r['param_set'])} | {s['us_per_step']:,.1f} "
            f"| {f['us_per_step']:,.1f} | {r['ratio_stock_over_fused']:.2f} "
            f"| {s['us_per_array']:.2f} | {f['us_per_array']:.2f} "
            f"| {s['cpu_us_per_step']:,.1f} | {f['cpu_us_per_step']:,.1f} "
            f"| {r['cpu_ratio_stock_over_fused']:.2f} |"
        )
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = standalone.argument_parser(__doc__, NAME)
    args = parser.parse_args(argv)
    mode = standalone.mode_of(args)
    settings = MODES[mode]
    load = standalone.OtherLoad()

    failures: List[str] = []
    checks: List[dict] = []
    if args.check:
        for optimizer_key in OPTIMIZERS:
            for set_name in settings["sets"]:
                checks.append(check_case(optimizer_key, set_name))
                failures += checks[-1]["failures"]
        sgd = [c["max_relative_difference"] for c in checks if c["optimizer"] == "sgd"]
        print(f"plain SGD: largest relative difference of a step {max(sgd):.3g} (bound {SGD_RTOL})")
        print(
            "Correctness: "
            + (
                "fused and stock updaters agree (bit-identical: SGD momentum, NAG, Adam; "
                f"SGD within rtol {SGD_RTOL} per step)"
                if not failures
                else "FAILED"
            )
        )
        for failure in failures:
            print(f"  {failure}")

    results = []
    for set_name in settings["sets"]:
        for optimizer_key in OPTIMIZERS:
            result = time_case(optimizer_key, set_name, settings["target"], settings["rounds"])
            results.append(result)
            if not args.check:
                print(
                    f"{result['label']:<12} {describe_set(set_name):<16} "
                    f"stock {result['stock']['us_per_step']:9.1f} us/step, "
                    f"fused {result['fused']['us_per_step']:9.1f} us/step, "
                    f"x {result['ratio_stock_over_fused']:.2f}",
                    flush=True,
                )
    print()
    print(f"{mode} run, medians over {settings['rounds']} rounds (wall time after waitall; ")
    print("CPU: the Python thread's time.thread_time()); x: stock / fused, above 1 = fused faster")
    print(format_table(results))

    return standalone.finish(
        NAME,
        args,
        load,
        {
            "optimizers": {k: {"name": v[0], **COMMON, **v[1]} for k, v in OPTIMIZERS.items()},
            **settings,
        },
        results,
        failures,
        checked=bool(args.check),
        cases=checks,
    )


if __name__ == "__main__":
    sys.exit(main())
