"""Micro-benchmark of mxoid's own costs.

1. Hook dispatch: the time to fire ``after_batch`` through mxoid's
   ``HookDispatcher`` (as ``MainLoop`` does, with the dispatcher's ``runner``)
   to 10 and 50 extensions that do nothing, written three ways: overriding the
   hook, implementing ``do`` with a condition that holds every batch, and
   implementing ``do`` with a condition that does not hold. The best of
   several repeats, as ``timeit`` reports.
2. Per-batch cost of extensions: a bare MainLoop (FinishAfter only) against the
   same loop plus one everyday extension (TrainingMonitoring of accuracy and
   cross-entropy, ProgressBar, Printing, Timing, JSONLinesLog) or all of them,
   on the MLP at batch 32, in one process, the variants interleaved over several
   rounds (each run's median epoch, then the best run of each variant). The
   wall-clock difference per batch counts everything the
   extension makes the loop do, device work included; the CPU-time difference
   (every thread of the process) counts the same work and is less disturbed by
   other processes on a shared machine; the host time in its
   per-batch hooks (``before_batch``, ``after_batch``) comes from the loop's
   own profile.

Usage::

    python benchmarks/micro.py [--quick | --tiny] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from types import SimpleNamespace
from typing import Callable, Dict, List, Optional, Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import contenders  # noqa: E402  (sets the thread settings before MXNet is imported)
import mxnet as mx  # noqa: E402
import numpy as np  # noqa: E402

from mxoid import Extension, FinishAfter, MainLoop  # noqa: E402
from mxoid.extensions.dispatch import HookDispatcher  # noqa: E402
from mxoid.log import TrainingLog, TrainingStatus  # noqa: E402

SIZES = {
    "full": {
        "fires": 20000,
        "repeats": 7,
        "samples": 4096,
        "epochs": 3,
        "rounds": 5,
        "cells": [(1, None), (2, ("TrainingMonitoring", "all everyday"))],
    },
    "quick": {
        "fires": 5000,
        "repeats": 5,
        "samples": 2048,
        "epochs": 2,
        "rounds": 2,
        "cells": [(1, None)],
    },
    "tiny": {
        "fires": 500,
        "repeats": 2,
        "samples": 256,
        "epochs": 1,
        "rounds": 1,
        "cells": [(1, ("TrainingMonitoring", "all everyday"))],
    },
}


# -------------------------------------------------------------- hook dispatch
class OverridesHook(Extension):
    def after_batch(self, batch):
        pass


class DoesNothing(Extension):
    def do(self, which_callback, *args):
        pass


STYLES = {
    "no-op after_batch override": lambda: OverridesHook(),
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
    dispatcher = HookDispatcher(extensions)
    runner = getattr(dispatcher, "runner", None)
    fire = runner("after_batch") if runner else (lambda *a: dispatcher.fire("after_batch", *a))
    batch = object()
    timings = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(fires):
            fire(batch)
        timings.append((time.perf_counter() - start) / fires)
    per_hook = 1e6 * min(timings)  # as timeit: other processes only ever add time
    return {
        "extensions": count,
        "style": style,
        "us_per_hook": per_hook,
        "us_per_extension": per_hook / count,
        "fires": fires,
        "repeats": repeats,
    }


# ------------------------------------------------------- per-batch extension cost
def variant_factories(workdir: str):
    """Name -> function(tag) returning the extensions to add to the bare loop; and notes."""
    found, notes = contenders.find_everyday_extensions()
    build = contenders.build_everyday
    makers: Dict[str, Callable[[str], list]] = {}

    def maker(name: str, cls) -> Callable[[str], list]:
        return lambda tag: [build(name, cls, workdir, tag)]

    for name, cls in found.items():
        makers[name] = maker(name, cls)
    if found:
        makers["all everyday"] = lambda tag: [build(n, c, workdir, tag) for n, c in found.items()]
    return makers, notes


def _silence_stdout():
    """Printing writes reports to stdout; keep them out of the micro-benchmark's output."""
    return open(os.devnull, "w")


def loop_run(data, num_contexts: int, extensions: list, epochs: int) -> Dict[str, object]:
    X, y = data
    train = mx.io.NDArrayIter(X, y, batch_size=32, shuffle=False, label_name="softmax_label")
    clock = contenders.EpochClock()
    loop = MainLoop(
        contenders.build_symbol("mlp"),
        train,
        contexts=contenders.contexts(num_contexts),
        optimizer="sgd",
        optimizer_params=dict(contenders.OPTIMIZER_PARAMS),
        arg_params={k: mx.nd.array(v) for k, v in contenders.initial_params("mlp").items()},
        extensions=[
            FinishAfter(after_n_epochs=1 + epochs),
            *extensions,
            contenders._clock_extension(clock),
        ],
    )
    stdout, sys.stdout = sys.stdout, _silence_stdout()
    try:
        clock.tick()
        loop.run()
    finally:
        sys.stdout.close()
        sys.stdout = stdout
    seconds = np.diff(clock.stamps)[1:]
    cpu_seconds = np.diff(clock.cpu_stamps)[1:]
    batches = loop.status.iterations_done // (1 + epochs)
    names = {e.name for e in extensions}
    # Only the per-batch hooks: an after_epoch hook that reads a value back waits
    # there for the epoch's queued work, which is not its own cost.
    hook_seconds = sum(
        s
        for name, hook, _, s in loop.profile()
        if name in names and hook in ("before_batch", "after_batch")
    )
    return {
        "batch_seconds": float(np.median(seconds)) / batches,
        "batch_cpu_seconds": float(np.median(cpu_seconds)) / batches,
        "hook_seconds_per_batch": hook_seconds / loop.status.iterations_done,
    }


def per_batch_costs(size: dict, workdir: str) -> (List[dict], List[str]):
    makers, notes = variant_factories(workdir)
    data = contenders.make_data("mlp", size["samples"])
    results = []
    for num_contexts, only in size["cells"]:
        variants = {name: maker for name, maker in makers.items() if only is None or name in only}
        runs: Dict[str, List[dict]] = {"bare": []}
        runs.update({name: [] for name in variants})
        counter = 0
        loop_run(data, num_contexts, [], 1)  # warm the process (first binds are slower)
        for _ in range(size["rounds"]):
            runs["bare"].append(loop_run(data, num_contexts, [], size["epochs"]))
            for name, maker in variants.items():
                counter += 1
                runs[name].append(loop_run(data, num_contexts, maker(str(counter)), size["epochs"]))
        # Each run's median epoch, then the best run of each variant: other
        # processes only ever add time, so the fastest run is the least disturbed.
        bare = min(r["batch_seconds"] for r in runs["bare"])
        bare_cpu = min(r["batch_cpu_seconds"] for r in runs["bare"])
        cell = f"MLP b32 {num_contexts} ctx"
        results.append(
            {
                "name": "bare MainLoop (FinishAfter only)",
                "cell": cell,
                "batch_us": 1e6 * bare,
                "us_per_batch": 0.0,
                "batch_cpu_us": 1e6 * bare_cpu,
                "cpu_us_per_batch": 0.0,
                "hook_us_per_batch": 0.0,
            }
        )
        for name in variants:
            seconds = min(r["batch_seconds"] for r in runs[name])
            cpu = min(r["batch_cpu_seconds"] for r in runs[name])
            hooks = min(r["hook_seconds_per_batch"] for r in runs[name])
            results.append(
                {
                    "name": f"+ {name}",
                    "cell": cell,
                    "batch_us": 1e6 * seconds,
                    "us_per_batch": 1e6 * (seconds - bare),
                    "batch_cpu_us": 1e6 * cpu,
                    "cpu_us_per_batch": 1e6 * (cpu - bare_cpu),
                    "hook_us_per_batch": 1e6 * hooks,
                }
            )
    return results, notes


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--quick", action="store_true")
    group.add_argument("--tiny", action="store_true", help="a few seconds; for the tests")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args(argv)
    size = SIZES["quick" if args.quick else "tiny" if args.tiny else "full"]

    dispatch = [
        dispatch_cost(count, style, size["fires"] * 10 // count, size["repeats"])
        for count in (10, 50)
        for style in STYLES
    ]
    with tempfile.TemporaryDirectory(prefix="mxoid-micro-") as workdir:
        per_batch, notes = per_batch_costs(size, workdir)
    report = {"dispatch": dispatch, "per_batch": per_batch, "notes": notes}
    for entry in dispatch:
        print(
            f"dispatch to {entry['extensions']:>2} {entry['style']:<28}: "
            f"{entry['us_per_hook']:8.2f} us per hook, "
            f"{entry['us_per_extension']:.3f} us per extension"
        )
    for entry in per_batch:
        print(
            f"{entry['name']:<36} {entry['cell']}: {entry['batch_us']:8.1f} us/batch wall "
            f"({entry['us_per_batch']:+.1f}), {entry['batch_cpu_us']:8.1f} us/batch CPU "
            f"({entry['cpu_us_per_batch']:+.1f}); in its per-batch hooks "
            f"{entry['hook_us_per_batch']:.1f} us"
        )
    for note in notes:
        print(f"note: {note}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
