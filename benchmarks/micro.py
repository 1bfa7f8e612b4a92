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
   on the MLP at batch 32, the variants trained in turns in one process, an
   epoch each per round (``interleave.py``, as ``run.py`` trains its
   contenders). Per variant: the wall-clock and CPU-time (every thread)
   differences per batch to the bare loop's epoch of the same round (medians
   over the rounds; the wall-clock one with a 90% bootstrap interval), which
   count everything the extension makes the loop do, device work included;
   its throughput over the bare loop's, round by round, with a 90% interval;
   and the host time in its per-batch hooks (``before_batch``,
   ``after_batch``) from the loop's own profile.

   Many rounds (full size: 100 epochs of 256 batches per variant): on this
   2-core virtual machine one round's difference varies by about 40 us per
   batch (standard deviation), so 30 rounds left the median uncertain by
   about +-10 us, as wide as the 10 us target it is held to; over 100 rounds
   the 90% interval is about +-6 us. Work an extension does once an epoch
   counts over 256 batches (with epochs of 64 batches, ProgressBar measured
   +9.8 us per batch, with 256, +3.9: its bar is closed and opened at each
   epoch's end, in a Python thread just woken from waiting for the engine).

Usage::

    python benchmarks/micro.py [--quick | --tiny] [--json PATH]
    python benchmarks/micro.py --contexts 2 --variants TrainingMonitoring --rounds 200 \\
        --no-dispatch   # one extension's cost, measured longer
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
        "samples": 8192,
        "rounds": 100,
        "cells": [(1, None), (2, ("TrainingMonitoring", "all everyday"))],
    },
    "quick": {
        "fires": 5000,
        "repeats": 5,
        "samples": 4096,
        "rounds": 30,
        "cells": [(1, None)],
    },
    "tiny": {
        "fires": 500,
        "repeats": 2,
        "samples": 256,
        "rounds": 2,
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


def variant_function(extensions: Callable[[], list], profiles: Dict[str, list], name: str):
    """A training function for ``interleave.Player``: the bare loop plus ``extensions()``,
    which notes the loop's hook profile (for the host time in the per-batch hooks)."""

    def train(spec, iterator, init, clock):
        added = extensions()
        loop = MainLoop(
            contenders.build_symbol("mlp"),
            iterator,
            contexts=contenders.contexts(spec["contexts"]),
            optimizer="sgd",
            optimizer_params=dict(contenders.OPTIMIZER_PARAMS),
            arg_params={k: mx.nd.array(v) for k, v in init.items()},
            extensions=[
                FinishAfter(after_n_epochs=spec["epochs"]),
                *added,
                contenders._clock_extension(clock),
            ],
        )
        loop.run()
        names = {e.name for e in added}
        profiles[name] = [
            (hook, seconds / max(loop.status.iterations_done, 1))
            for extension, hook, _, seconds in loop.profile()
            if extension in names
        ]
        return {k: v.asnumpy() for k, v in loop.get_params()[0].items()}

    return train


def per_batch_costs(size: dict, workdir: str) -> (List[dict], List[str]):
    """Each everyday extension (and all of them) added to the bare loop, the variants
    trained in turns in this process, an epoch each per round (``interleave.py``)."""
    import interleave
    from intervals import paired_difference, paired_ratio

    makers, notes = variant_factories(workdir)
    X, y = contenders.make_data("mlp", size["samples"])
    data, label = mx.nd.array(X), mx.nd.array(y)
    init = contenders.initial_params("mlp")
    batches = -(-size["samples"] // 32)
    results = []
    counter = 0
    for num_contexts, only in size["cells"]:
        unknown = sorted(set(only or ()) - set(makers))
        if unknown:
            raise ValueError(f"unknown variants {unknown}; the variants are {sorted(makers)}")
        variants = {"bare": lambda: []}
        for name, maker in makers.items():
            if only is None or name in only:
                counter += 1
                variants[name] = lambda maker=maker, tag=str(counter): maker(tag)
        spec = {
            "model": "mlp",
            "batch_size": 32,
            "contexts": num_contexts,
            "optimizer": "momentum",
            "epochs": 1 + size["rounds"],
            "workdir": os.path.join(workdir, f"ctx{num_contexts}"),
        }
        profiles: Dict[str, list] = {}
        players = {
            name: interleave.Player(
                name, spec, data, label, init, variant_function(make, profiles, name)
            )
            for name, make in variants.items()
        }
        names = list(players)
        stdout, sys.stdout = sys.stdout, _silence_stdout()
        try:
            for player in players.values():
                player.thread.start()
            for round_index in range(spec["epochs"]):
                for name in interleave.shuffled(names, round_index):
                    players[name].play()
            for player in players.values():
                player.finish()
        finally:
            sys.stdout.close()
            sys.stdout = stdout
        failed = [f"{n}: {p.error}" for n, p in players.items() if p.error]
        if failed:
            raise RuntimeError("micro-benchmark variants failed:\n" + "\n".join(failed))
        timed = {n: p.result() for n, p in players.items()}
        rows = {n: {**r, "samples_per_epoch": size["samples"]} for n, r in timed.items()}
        for r in rows.values():
            r["epoch_seconds"] = [r["epoch_seconds"]]
        bare = np.asarray(timed["bare"]["epoch_seconds"])
        bare_cpu = np.asarray(timed["bare"]["epoch_cpu_seconds"])
        cell = f"MLP b32 {num_contexts} ctx"
        for name in names:
            wall = np.asarray(timed[name]["epoch_seconds"])
            cpu = np.asarray(timed[name]["epoch_cpu_seconds"])
            ratio, interval = paired_ratio(rows[name], rows["bare"])
            extra, (low, high) = paired_difference(wall / batches, bare / batches)
            results.append(
                {
                    "name": "bare MainLoop (FinishAfter only)" if name == "bare" else f"+ {name}",
                    "cell": cell,
                    "batch_us": 1e6 * float(np.median(wall)) / batches,
                    # round by round against the bare loop's epoch of the same round
                    "us_per_batch": 1e6 * extra,
                    "us_per_batch_interval": [1e6 * low, 1e6 * high],
                    "batch_cpu_us": 1e6 * float(np.median(cpu)) / batches,
                    "cpu_us_per_batch": 1e6 * float(np.median(cpu - bare_cpu)) / batches,
                    "throughput_vs_bare": ratio,
                    "throughput_vs_bare_interval": interval,
                    # Only the per-batch hooks: an after_epoch hook that reads a value
                    # back waits there for the epoch's queued work, not its own cost.
                    "hook_us_per_batch": 1e6
                    * sum(
                        seconds
                        for hook, seconds in profiles.get(name, ())
                        if hook in ("before_batch", "after_batch")
                    ),
                }
            )
    return results, notes


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--quick", action="store_true")
    group.add_argument("--tiny", action="store_true", help="a few seconds; for the tests")
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument(
        "--contexts",
        type=int,
        choices=(1, 2),
        help="per-batch costs on this many contexts only (default: as the size says)",
    )
    parser.add_argument(
        "--variants",
        help="per-batch costs of these variants only, comma-separated (e.g. "
        "TrainingMonitoring; the bare loop always runs)",
    )
    parser.add_argument("--rounds", type=int, help="rounds (epochs per variant) to time")
    parser.add_argument(
        "--no-dispatch", action="store_true", help="skip the hook-dispatch measurement"
    )
    args = parser.parse_args(argv)
    size = dict(SIZES["quick" if args.quick else "tiny" if args.tiny else "full"])
    if args.rounds is not None:
        if args.rounds < 2:
            parser.error("--rounds must be at least 2")
        size["rounds"] = args.rounds
    if args.contexts is not None or args.variants is not None:
        only = tuple(v.strip() for v in args.variants.split(",")) if args.variants else None
        contexts = [args.contexts] if args.contexts else sorted({c for c, _ in size["cells"]})
        size["cells"] = [(c, only) for c in contexts]

    dispatch = [
        dispatch_cost(count, style, size["fires"] * 10 // count, size["repeats"])
        for count in (10, 50)
        for style in STYLES
        if not args.no_dispatch
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
            f"({entry['us_per_batch']:+.1f}, 90%: {entry['us_per_batch_interval'][0]:+.1f} to "
            f"{entry['us_per_batch_interval'][1]:+.1f}), {entry['batch_cpu_us']:8.1f} us/batch CPU "
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
