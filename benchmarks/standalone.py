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

THREAD_SETTINGS = {
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MXNET_CPU_WORKER_NTHREADS": "1",
    "MXNET_SUBGRAPH_VERBOSE": "0",
}
os.environ.update(THREAD_SETTINGS)

import run as runner  # noqa: E402  (machine_info, the CPU counters; it imports no MXNet)

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
