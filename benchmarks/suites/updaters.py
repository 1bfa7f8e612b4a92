"""The updaters suite: MXNet's stock updater against mxoid's FusedUpdater, per step.

Both called as the loop calls them, ``updater(indices, grads, weights)``: SGD, SGD and
NAG with momentum, Adam, on the MLP's 6 arrays and 10 to 200 arrays of (16, 16),
alternating round after round. ``--check``: bit-identical weights and states step by
step (plain SGD within ``rtol=1e-6``: ``multi_sgd_update`` rounds otherwise).
"""

import sys
import time
from typing import Dict, List, Optional, Sequence

import mxnet as mx
import numpy as np
from harness import report, turns

from suites.internals import FusedUpdater, fused_kernel

OPTIMIZERS = {  # key -> (MXNet optimizer, its parameters, label)
    "sgd": ("sgd", {}, "SGD"),
    "sgd_mom": ("sgd", {"momentum": 0.9}, "SGD mom 0.9"),
    "nag": ("nag", {"momentum": 0.9}, "NAG mom 0.9"),
    "adam": ("adam", {}, "Adam"),
}
COMMON = {"learning_rate": 0.01, "wd": 1e-4, "rescale_grad": 1.0 / 32}
BIT_IDENTICAL = ("sgd_mom", "nag", "adam")
SGD_RTOL = 1e-6
MLP = [("fc1_weight", (128, 784)), ("fc1_bias", (128,)), ("fc2_weight", (64, 128))]
MLP += [("fc2_bias", (64,)), ("fc3_weight", (10, 64)), ("fc3_bias", (10,))]
ALL_SETS = ["mlp", "sweep10", "sweep50", "sweep100", "sweep200"]
KEYS = ("target", "rounds", "sets")  # target: seconds a measurement (steps calibrated to it)
MODES = {
    "full": (0.25, 11, ALL_SETS),
    "quick": (0.06, 5, ALL_SETS),
    "check": (0.005, 1, ALL_SETS[:2]),
}
CHECK_STEPS = 6


def param_set(name: str) -> List[tuple]:
    """``(name, shape)`` of each array of a parameter set."""
    if name == "mlp":
        return list(MLP)
    return [(f"p{i}_weight", (16, 16)) for i in range(int(name[len("sweep") :]))]


def describe_set(name: str) -> str:
    return "MLP (6 arrays)" if name == "mlp" else f"{name[len('sweep') :]} x (16,16)"


class Contender:
    """One updater (``stock`` or ``fused``) with its own optimizer, weights and gradients."""

    def __init__(self, kind: str, optimizer_key: str, arrays: List[tuple]) -> None:
        name, extra, _ = OPTIMIZERS[optimizer_key]
        names = {i: n for i, (n, _) in enumerate(arrays)}
        self.optimizer = mx.optimizer.create(name, param_idx2name=names, **COMMON, **extra)
        if kind == "stock":
            self.updater = mx.optimizer.get_updater(self.optimizer)
        else:
            self.updater = FusedUpdater(self.optimizer)
        rng = np.random.RandomState(0)
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
        return {"wall": (time.perf_counter() - wall0) / steps, "cpu": (cpu1 - cpu0) / steps}


def _states(updater) -> List[np.ndarray]:
    """Every state array of an updater, in key order."""

    def flat(state) -> list:
        if isinstance(state, (list, tuple)):
            return [array for part in state for array in flat(part)]
        return [] if state is None else [state.asnumpy()]

    return [array for key in sorted(updater.states) for array in flat(updater.states[key])]


def check_case(optimizer_key: str, set_name: str) -> dict:
    """Step both updaters on the same fresh gradients; the disagreements found and, for
    plain SGD, the largest relative difference of a step."""
    arrays = param_set(set_name)
    stock, fused = (Contender(kind, optimizer_key, arrays) for kind in ("stock", "fused"))
    failures, worst_relative = [], 0.0
    if fused_kernel(fused.optimizer) is None:
        failures.append(f"{optimizer_key}: FusedUpdater takes the stock path")
    rng = np.random.RandomState(1)
    where = f"{OPTIMIZERS[optimizer_key][2]}, {describe_set(set_name)}"
    for step in range(1, CHECK_STEPS + 1):
        before = [w.asnumpy() for w in stock.weights]
        new_grads = [rng.standard_normal(s).astype(np.float32) for _, s in arrays]
        for contender in (stock, fused):
            for grad, value in zip(contender.grads, new_grads):
                grad[:] = value
            contender.step()
        ws, wf = [w.asnumpy() for w in stock.weights], [w.asnumpy() for w in fused.weights]
        if optimizer_key in BIT_IDENTICAL:
            same = all(np.array_equal(a, b) for a, b in zip(ws, wf))
            states = zip(_states(stock.updater), _states(fused.updater))
            states = all(np.array_equal(a, b) for a, b in states)
            if not same or not states:
                worst = max(float(np.abs(a - b).max()) for a, b in zip(ws, wf))
                equal = f"weights equal: {same}, states equal: {states}, max |diff| {worst:.3g}"
                failures.append(f"{where}, step {step}: not bit-identical ({equal})")
                break
            continue
        # Relative to the magnitudes the step computes with (the weight before and after):
        # a weight that lands near zero keeps the rounding error of its terms.
        scale = [np.maximum(np.maximum(np.abs(a), np.abs(w)), 1e-30) for a, w in zip(ws, before)]
        worst = max(float((np.abs(b - a) / s).max()) for a, b, s in zip(ws, wf, scale))
        worst_relative = max(worst_relative, worst)
        if worst > SGD_RTOL:
            failures.append(f"{where}, step {step}: relative difference {worst:.3g} > {SGD_RTOL}")
            break
        for weight, value in zip(fused.weights, ws):  # per step: start alike again
            weight[:] = value
    if not np.isfinite(np.concatenate([w.asnumpy().ravel() for w in fused.weights])).all():
        failures.append(f"{where}: non-finite weights")
    exact = optimizer_key in BIT_IDENTICAL
    case = {"optimizer": optimizer_key, "param_set": set_name, "steps": CHECK_STEPS}
    case["compared"] = "bit-identical" if exact else f"rtol {SGD_RTOL}"
    case["max_relative_difference"] = None if exact else worst_relative
    return {**case, "failures": failures}


def time_case(optimizer_key: str, set_name: str, target: float, rounds: int) -> dict:
    """Both updaters, the same number of steps a measurement, alternating round by round."""
    arrays = param_set(set_name)
    contenders = {kind: Contender(kind, optimizer_key, arrays) for kind in ("stock", "fused")}
    for contender in contenders.values():  # states created, kernels warmed
        for _ in range(3):
            contender.step()
    probe = max(c.measure(5)["wall"] for c in contenders.values())
    steps = max(5, int(target / max(probe, 1e-6)))  # target seconds of the slower one
    measured = turns.interleave(
        lambda kind: contenders[kind].measure(steps), list(contenders), rounds, turns.alternating
    )
    result = {"optimizer": optimizer_key, "label": OPTIMIZERS[optimizer_key][2], "rounds": rounds}
    result.update(param_set=set_name, set=describe_set(set_name), arrays=len(arrays))
    result.update(parameters=int(sum(np.prod(s) for _, s in arrays)), steps_per_measurement=steps)
    result["kernel"] = fused_kernel(contenders["fused"].optimizer)
    for kind, values in measured.items():
        wall = np.array([v["wall"] for v in values]) * 1e6
        cpu = np.array([v["cpu"] for v in values]) * 1e6
        median, cpu_median = float(np.median(wall)), float(np.median(cpu))
        times = dict(us_per_step=median, us_per_step_min=float(wall.min()))
        times.update(us_per_step_max=float(wall.max()), us_per_array=median / len(arrays))
        times.update(cpu_us_per_step=cpu_median, cpu_us_per_array=cpu_median / len(arrays))
        times.update(wall_us=wall.tolist(), cpu_us=cpu.tolist())
        result[kind] = times
    stock, fused = result["stock"], result["fused"]
    result["ratio_stock_over_fused"] = stock["us_per_step"] / fused["us_per_step"]
    result["cpu_ratio_stock_over_fused"] = stock["cpu_us_per_step"] / fused["cpu_us_per_step"]
    pairs = list(zip(measured["stock"], measured["fused"]))  # measured back to back
    result["ratio_per_round_median"] = float(np.median([s["wall"] / f["wall"] for s, f in pairs]))
    result["cpu_ratio_per_round_median"] = float(np.median([s["cpu"] / f["cpu"] for s, f in pairs]))
    return result


COLUMNS = (
    ("optimizer", "{label}"),
    ("parameters", "{set}"),
    ("stock us/step", "{stock[us_per_step]:,.1f}"),
    ("fused us/step", "{fused[us_per_step]:,.1f}"),
    ("x (stock/fused)", "{ratio_stock_over_fused:.2f}"),
    ("stock us/array", "{stock[us_per_array]:.2f}"),
    ("fused us/array", "{fused[us_per_array]:.2f}"),
    ("stock CPU us/step", "{stock[cpu_us_per_step]:,.1f}"),
    ("fused CPU us/step", "{fused[cpu_us_per_step]:,.1f}"),
    ("CPU x (stock/fused)", "{cpu_ratio_stock_over_fused:.2f}"),
)


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = report.parser(__doc__, "updaters").parse_args(argv)
    run = report.Run("updaters", args, argv)
    settings = dict(zip(KEYS, MODES[run.mode]))
    checks = []
    if args.check:
        checks = [check_case(o, s) for o in OPTIMIZERS for s in settings["sets"]]
        sgd = max(c["max_relative_difference"] for c in checks if c["optimizer"] == "sgd")
        print(f"plain SGD: largest relative difference of a step {sgd:.3g} (bound {SGD_RTOL})")
    target, rounds = settings["target"], settings["rounds"]
    results = [time_case(o, s, target, rounds) for s in settings["sets"] for o in OPTIMIZERS]
    print(f"{run.mode} run, medians over {rounds} rounds (wall time after waitall; CPU: the")
    print("Python thread's); x: stock / fused, above 1: the fused updater is faster")
    print(report.table_of(COLUMNS, results, "llrrrrrrrr"))
    optimizers = {k: {"name": v[0], **COMMON, **v[1]} for k, v in OPTIMIZERS.items()}
    failures = [f for c in checks for f in c["failures"]]
    correctness = {"checked": bool(args.check), "cases": checks}
    settings = {"optimizers": optimizers, **settings}
    return run.finish(failures, settings, results, correctness=correctness)
