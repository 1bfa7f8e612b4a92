"""What the standalone benchmarks (updaters.py, prefetch.py, evaluate.py) share.

Importing it puts the thread settings of run.py's workers in the environment
(one OpenMP thread, one engine worker), so it comes before MXNet is imported.
It also gives the three scripts their command line (``--quick``, ``--check``,
``--json``), the load that other processes put on the machine meanwhile, and
the JSON report with the machine's description.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any, Dict

import run as runner  # machine_info, the CPU counters, the thread settings; no MXNet

THREAD_SETTINGS = runner.THREAD_SETTINGS
os.environ.update(THREAD_SETTINGS)

HERE = os.path.dirname(os.path.abspath(__file__))


def argument_parser(doc: str, name: str) -> argparse.ArgumentParser:
    """Return the parser of ``--quick``, ``--check`` and ``--json`` (add your own options)."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--quick", action="store_true", help="under 30 s")
    group.add_argument("--check", action="store_true", help="correctness only, a few seconds")
    parser.add_argument(
        "--json",
        help=f"where to write the results (default results/{name}.json; "
        f"results/{name}-check.json with --check)",
    )
    return parser


def mode_of(args: argparse.Namespace) -> str:
    """Return 'check', 'quick' or 'full'."""
    return "check" if args.check else "quick" if args.quick else "full"


class OtherLoad:
    """CPU time other processes used since construction, in cores (as run.py's ``load``)."""

    def __init__(self) -> None:
        self.started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        self.busy, self.own = runner._cpu_busy_seconds(), time.process_time()
        self.wall = time.perf_counter()

    def cores(self) -> float:
        """Return the other processes' mean load since construction."""
        busy = runner._cpu_busy_seconds() - self.busy
        own = time.process_time() - self.own
        return max(0.0, (busy - own) / (time.perf_counter() - self.wall))


def write_report(
    name: str, args: argparse.Namespace, load: OtherLoad, fields: Dict[str, Any]
) -> str:
    """Print the load of other processes, write the JSON report with ``fields``; return its path."""
    import mxnet as mx

    other_load = load.cores()
    print(
        f"other processes kept {other_load:.2f} of {os.cpu_count()} cores busy meanwhile "
        "(above about 0.1 the figures are disturbed)"
    )
    report = {
        "benchmark": name,
        "mode": mode_of(args),
        "started": load.started,
        "machine": runner.machine_info(),
        "mxnet": mx.__version__,
        "thread_settings": THREAD_SETTINGS,
        "other_load_cores": other_load,
        **fields,
    }
    path = args.json or os.path.join(
        HERE, "results", f"{name}-check.json" if args.check else f"{name}.json"
    )
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(report, f, indent=1)
    print(f"results written to {path}")
    return path


def finish(
    name: str,
    args: argparse.Namespace,
    load: OtherLoad,
    settings: Dict[str, Any],
    results: Any,
    failures: list,
    checked: bool = True,
    **correctness: Any,
) -> int:
    """Write the report (settings, results, the correctness check); print the failures.

    Return the exit status: 1 when a correctness check failed (speed never changes it).
    """
    write_report(
        name,
        args,
        load,
        {
            "settings": settings,
            "results": results,
            "correctness": {
                "checked": checked,
                "ok": not failures,
                "failures": failures,
                **correctness,
            },
        },
    )
    if failures:
        print("Correctness: FAILED")
        for failure in failures:
            print(f"  {failure}")
    return 1 if failures else 0
