"""The environment of every benchmark: thread settings, the machine, other processes' load.

Imports no MXNet: :func:`apply_thread_settings` must run before MXNet is imported,
since MXNet reads the thread settings once, at import.
"""

import os
import platform
import subprocess
import sys
import time
from typing import Dict, Optional

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # benchmarks/
ROOT = os.path.dirname(HERE)  # the checkout, holding the mxoid package
RESULTS = os.path.join(HERE, "results")
THREAD_SETTINGS = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
THREAD_SETTINGS.update(MXNET_CPU_WORKER_NTHREADS="1", MXNET_SUBGRAPH_VERBOSE="0")
WORKER_ENV = {**THREAD_SETTINGS, "PYTHONHASHSEED": "0"}


def apply_thread_settings() -> None:
    """Put :data:`THREAD_SETTINGS` in ``os.environ``, whatever it said; before MXNet's import."""
    if "mxnet" in sys.modules:
        raise RuntimeError("the thread settings must be applied before MXNet is imported")
    os.environ.update(THREAD_SETTINGS)


def worker_env(mxoid_root: str = ROOT) -> Dict[str, str]:
    """The environment of worker processes: this one's, the thread settings, and a
    ``PYTHONPATH`` giving ``mxoid_root``'s mxoid and ``benchmarks/`` first."""
    env = dict(os.environ, **WORKER_ENV)
    paths = [mxoid_root, HERE] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


def machine_info(mxoid_root: str = ROOT) -> Dict[str, object]:
    """The CPU, Python, platform, and the commit of the mxoid measured."""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = [ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")]
    except OSError:
        cpu = []

    def git(*args: str) -> str:
        try:
            done = subprocess.run(["git", "-C", mxoid_root, *args], capture_output=True, text=True)
        except OSError:
            return ""
        return done.stdout.strip()

    machine = {"nproc": os.cpu_count(), "cpu": (cpu or ["unknown"])[0], "mxoid_path": mxoid_root}
    machine.update(platform=platform.platform(), python=platform.python_version())
    machine["mxoid_commit"] = git("rev-parse", "--short", "HEAD")
    return {**machine, "mxoid_uncommitted_changes": bool(git("status", "--porcelain", "mxoid"))}


def cpu_busy_seconds() -> float:
    """Seconds of CPU time the whole machine spent busy since boot (all cores)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


class OtherLoad:
    """CPU time that other processes used since construction, in cores."""

    def __init__(self) -> None:
        self.busy, self.own = cpu_busy_seconds(), time.process_time()
        self.wall = time.perf_counter()

    def cores(self, own_seconds: Optional[float] = None) -> float:
        """Their mean load; ``own_seconds``: this process's CPU time if not its own clock's."""
        own = time.process_time() - self.own if own_seconds is None else own_seconds
        busy = cpu_busy_seconds() - self.busy
        return max(0.0, (busy - own) / max(time.perf_counter() - self.wall, 1e-9))
