"""The micro suite: hook dispatch, and what each everyday extension adds to a batch.

Dispatch: ``after_batch`` through ``HookDispatcher.runner`` to 10 and 50 idle
extensions, three ways, best of several repeats. Per batch: the bare MainLoop against
it plus one everyday extension (or all), MLP b32, in turns in one process, round by
round against the bare loop (a full run: 100 rounds of 256 batches).
"""

import contextlib
import os
import sys
import tempfile
import time
from types import SimpleNamespace
from typing import Dict, Optional, Sequence

import mxnet as mx
import numpy as np
from harness import report, stats, turns, workload

from mxoid import Extension
from mxoid.log import TrainingLog, TrainingStatus
from suites.internals import HookDispatcher
from suites.workloads.symbol import micro_table
from suites.workloads.symbol_contenders import main_loop

# fires and repeats of each dispatch measurement; samples an epoch (batch 32); rounds;
# cells: (contexts, the variants measured there; None: all)
KEYS = ("fires", "repeats", "samples", "rounds", "cells")
TM_AND_ALL = ("TrainingMonitoring", "all everyday")
SIZES = {
    "full": (20000, 7, 8192, 100, [(1, None), (2, TM_AND_ALL)]),
    "quick": (5000, 5, 4096, 30, [(1, None)]),
    "check": (500, 2, 256, 2, [(1, TM_AND_ALL)]),
}


class OverridesHook(Extension):
    def after_batch(self, batch):
        pass


class DoesNothing(Extension):
    def do(self, which_callback, *args):
        pass


STYLES = {
    "no-op after_batch override": OverridesHook,
    "do(), condition holds": lambda: DoesNothing(after_batch=True),
    "do(), condition false": lambda: DoesNothing(every_n_batches=10**9),
}


def dispatch_cost(count: int, style: str, fires: int, repeats: int) -> Dict[str, object]:
    """Microseconds to fire ``after_batch`` once to ``count`` extensions of ``style``."""
    extensions = [STYLES[style]() for _ in range(count)]
    status = TrainingStatus(iterations_done=1)
    fake_loop = SimpleNamespace(status=status, log=TrainingLog(status))
    for extension in extensions:
        extension.main_loop = fake_loop
    fire, batch, timings = HookDispatcher(extensions).runner("after_batch"), object(), []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(fires):
            fire(batch)
        timings.append((time.perf_counter() - start) / fires)
    per_hook = 1e6 * min(timings)  # as timeit: other processes only ever add time
    entry = {"extensions": count, "style": style, "us_per_hook": per_hook}
    return {**entry, "us_per_extension": per_hook / count, "fires": fires, "repeats": repeats}


def variant(extensions, profiles: Dict[str, list], name: str):
    """A player's training function: the bare loop plus ``extensions()``; it keeps the
    loop's per-batch host time in each hook of the added extensions in ``profiles``."""

    def train(spec, iterator, init, clock):
        added = extensions()
        loop = main_loop(spec, iterator, init, clock, added)
        loop.run()
        names, batches = {e.name for e in added}, max(loop.status.iterations_done, 1)
        profile = [(ext, hook, seconds / batches) for ext, hook, _, seconds in loop.profile()]
        profiles[name] = [(hook, seconds) for ext, hook, seconds in profile if ext in names]
        return {k: v.asnumpy() for k, v in loop.get_params()[0].items()}

    return train


def per_batch_costs(size: dict, workdir: str):
    """Each everyday extension (and all) added to the bare loop, trained in turns."""
    factories, notes = workload.everyday_extensions(workdir)
    makers = {name: (lambda tag, make=make: [make(tag)]) for name, make in factories.items()}
    if factories:
        makers["all everyday"] = lambda tag: [make(tag) for make in factories.values()]
    X, y = workload.make_data("mlp", size["samples"])
    data, label, init = mx.nd.array(X), mx.nd.array(y), workload.initial_params("mlp")
    results, counter = [], 0
    for contexts, only in size["cells"]:
        unknown = sorted(set(only or ()) - set(makers))
        if unknown:
            raise ValueError(f"unknown variants {unknown}; the variants are {sorted(makers)}")
        variants = {"bare": lambda: []}
        for name, maker in makers.items():
            if only is None or name in only:
                counter += 1
                variants[name] = lambda maker=maker, tag=str(counter): maker(tag)
        spec = dict(model="mlp", batch_size=32, contexts=contexts, optimizer="momentum")
        spec.update(epochs=1 + size["rounds"], workdir=os.path.join(workdir, f"ctx{contexts}"))
        profiles: Dict[str, list] = {}
        players = {
            name: turns.Player(name, spec, data, label, init, variant(make, profiles, name))
            for name, make in variants.items()
        }
        with open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet):  # Printing's
            turns.play_rounds(players, spec["epochs"])
        failed = [f"{n}: {p.error}" for n, p in players.items() if p.error]
        if failed:
            raise RuntimeError("micro-benchmark variants failed:\n" + "\n".join(failed))
        timed = {n: p.result() for n, p in players.items()}
        cell = f"MLP b32 {contexts} ctx"
        results += [_cost(name, cell, timed, profiles, size["samples"]) for name in players]
    return results, notes


def _cost(name: str, cell: str, timed: Dict[str, dict], profiles, samples: int) -> dict:
    """A variant's costs per batch against the bare loop's, round by round."""
    batches = -(-samples // 32)
    rows = {n: {**r, "samples_per_epoch": samples} for n, r in timed.items()}
    for row in rows.values():
        row["epoch_seconds"] = [row["epoch_seconds"]]  # one process
    wall, bare = (np.asarray(timed[n]["epoch_seconds"]) for n in (name, "bare"))
    cpu, bare_cpu = (np.asarray(timed[n]["epoch_cpu_seconds"]) for n in (name, "bare"))
    ratio, interval = stats.paired_ratio(rows[name], rows["bare"])
    extra, (low, high) = stats.paired_difference(wall / batches, bare / batches)
    # The per-batch hooks only: an after_epoch hook that reads a value back waits there
    # for the epoch's queued work, not its own cost.
    hooks = [s for hook, s in profiles.get(name, ()) if hook in ("before_batch", "after_batch")]
    cost = {"name": "bare MainLoop (FinishAfter only)" if name == "bare" else f"+ {name}"}
    cost.update(cell=cell, batch_us=1e6 * float(np.median(wall)) / batches)
    cost.update(us_per_batch=1e6 * extra, us_per_batch_interval=[1e6 * low, 1e6 * high])
    cost["batch_cpu_us"] = 1e6 * float(np.median(cpu)) / batches
    cost["cpu_us_per_batch"] = 1e6 * float(np.median(cpu - bare_cpu)) / batches
    cost.update(throughput_vs_bare=ratio, throughput_vs_bare_interval=interval)
    return {**cost, "hook_us_per_batch": 1e6 * sum(hooks)}


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = report.parser(__doc__, "micro")
    parser.add_argument("--contexts", type=int, choices=(1, 2), help="per-batch costs there only")
    parser.add_argument("--variants", help="these only, comma-separated (e.g. TrainingMonitoring)")
    parser.add_argument("--rounds", type=int, help="rounds (epochs per variant) to time")
    parser.add_argument("--no-dispatch", action="store_true", help="skip the hook dispatch")
    args = parser.parse_args(argv)
    run = report.Run("micro", args, argv)
    size = dict(zip(KEYS, SIZES[run.mode]))
    if args.rounds is not None:
        if args.rounds < 2:
            parser.error("--rounds must be at least 2")
        size["rounds"] = args.rounds
    if args.contexts is not None or args.variants is not None:
        only = tuple(v.strip() for v in args.variants.split(",")) if args.variants else None
        contexts = [args.contexts] if args.contexts else sorted({c for c, _ in size["cells"]})
        size["cells"] = [(c, only) for c in contexts]
    counts, fires = () if args.no_dispatch else (10, 50), size["fires"] * 10
    dispatch = [
        dispatch_cost(n, style, fires // n, size["repeats"]) for n in counts for style in STYLES
    ]
    with tempfile.TemporaryDirectory(prefix="mxoid-micro-") as workdir:
        per_batch, notes = per_batch_costs(size, workdir)
    fields = {"dispatch": dispatch, "per_batch": per_batch, "notes": notes}
    print(micro_table(fields))
    return run.finish([], size, None, **fields)
