"""Benchmark mxoid against a hand-written loop, Module.fit, FeedForward and Gluon.

Each contender trains in a fresh process (forked from a fork server that has
only imported MXNet, or a new interpreter with ``--spawn``) with the same
thread settings, the same synthetic data and the same initial parameters: a
warm-up epoch, then timed epochs. This script runs them one after another,
prints a table per cell (model, batch size, contexts), checks that the
contenders which compute the same thing end with the same parameters as the
hand-written loop, runs the micro-benchmark (``micro.py``) and writes
everything as JSON.

Usage::

    python benchmarks/run.py             # full run: every cell (about 13 minutes)
    python benchmarks/run.py --quick     # the three target cells, short epochs (< 1 minute)
    python benchmarks/run.py --check     # correctness only: tiny epochs, two workers at once
    python benchmarks/run.py --contenders hand,mxoid_bare --cells mlp-32-1 --repeat 3

The exit status is 1 when a worker fails, a contender ends with non-finite
parameters, or one that must match the hand-written loop does not; speed
never changes it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from intervals import (  # noqa: E402, F401
    BOOTSTRAP_DRAWS,
    paired_ratio,
    paired_time_ratio,
    ratio_interval,
)

DEFAULT_JSON = os.path.join(HERE, "results", "latest.json")
ALL_CONTENDERS = (
    "hand",
    "hand_stock_updater",
    "module_fit_acc",
    "module_fit_nometric",
    "feedforward",
    "gluon",
    "mxoid_bare",
    "mxoid_everyday",
)
# Not in any mode's set: ``--contenders hand,hand_twin`` measures the design's noise floor.
EXTRA_CONTENDERS = ("hand_twin",)
EQUAL_TO_HAND = (
    "hand_twin",
    "hand_stock_updater",
    "module_fit_acc",
    "module_fit_nometric",
    "feedforward",
    "mxoid_bare",
    "mxoid_everyday",
)  # as contenders.EQUAL_TO_HAND, without importing MXNet
LABELS = {
    "hand": "hand loop (floor)",
    "hand_twin": "hand loop again (A/A)",
    "hand_stock_updater": "hand loop, stock updater",
    "module_fit_acc": "Module.fit, accuracy",
    "module_fit_nometric": "Module.fit, no metric",
    "feedforward": "FeedForward.fit, accuracy",
    "gluon": "Gluon hybridized, accuracy",
    "mxoid_bare": "mxoid bare",
    "mxoid_everyday": "mxoid everyday extensions",
}
# A cell: (model, batch size, contexts, optimizer); the optimizers are
# contenders.OPTIMIZERS' names ("momentum": SGD with momentum, "sgd": plain SGD,
# "adam"), each contender of a cell training with the cell's optimizer.
OPTIMIZER_LABELS = {"momentum": "", "sgd": ", SGD", "adam": ", Adam"}
DEFAULT_OPTIMIZER = "momentum"
ALL_CELLS = tuple(
    (model, batch, contexts, DEFAULT_OPTIMIZER)
    for model in ("mlp", "lenet")
    for batch in (32, 128)
    for contexts in (1, 2)
) + tuple(
    ("mlp", batch, contexts, optimizer)
    for optimizer in ("sgd", "adam")
    for batch in (32, 128)
    for contexts in (1, 2)
)
MODES = {
    "full": {
        "cells": ALL_CELLS,
        "samples": {"mlp": 16384, "lenet": 2048},
        # Adam cells: 128 batches an epoch, so that a worker trains at most 1,152 steps
        # (9 epochs): past about 1,400 steps on this easy data every contender, the hand
        # loop too, slowed down 3-10x on an Intel Xeon as the loss neared zero (denormal
        # numbers, most likely; not seen on an AMD EPYC), which would time the CPU's
        # arithmetic, not the loops.
        "adam_samples": {32: 4096, 128: 16384},
        "timed_epochs": 8,
        "processes": 3,
        "memory": True,
        "memory_timed_epochs": 1,
        "contenders": ALL_CONTENDERS,
        "parallel": 1,
        "micro": [],
    },
    "quick": {
        "cells": (
            ("mlp", 32, 1, "momentum"),
            ("mlp", 32, 2, "momentum"),
            ("lenet", 128, 2, "momentum"),
            ("mlp", 32, 1, "adam"),
        ),
        "samples": {"mlp": 4096, "lenet": 512},
        "adam_samples": 4096,
        "timed_epochs": 8,
        "processes": 1,
        "memory": False,
        "memory_timed_epochs": 1,
        "contenders": tuple(c for c in ALL_CONTENDERS if c != "hand_stock_updater"),
        "parallel": 1,
        "micro": ["--quick"],
    },
    "check": {
        "cells": (
            ("mlp", 32, 1, "momentum"),
            ("mlp", 32, 2, "momentum"),
            ("mlp", 32, 1, "sgd"),
            ("mlp", 32, 2, "adam"),
        ),
        "samples": {"mlp": 256, "lenet": 256},
        "adam_samples": 256,
        "timed_epochs": 2,
        "processes": 1,
        "memory": True,
        "memory_timed_epochs": 1,
        "contenders": ALL_CONTENDERS,
        "parallel": 2,
        "micro": ["--tiny"],
    },
}
# Every worker gets these, whatever the parent's environment says; other MXNET_*
# variables of the parent are passed on and recorded.
THREAD_SETTINGS = {  # also what contenders.py and the standalone benchmarks set
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MXNET_CPU_WORKER_NTHREADS": "1",
    "MXNET_SUBGRAPH_VERBOSE": "0",
}
WORKER_ENV = {**THREAD_SETTINGS, "PYTHONHASHSEED": "0"}
RTOL, ATOL = 1e-5, 1e-6
# MXNet's stock updater runs plain SGD through its multi-tensor kernel
# (multi_sgd_update), which rounds differently from sgd_update, the kernel of the
# hand loop and of mxoid (about 1e-7 relative per step: a few 1e-5 after the 3,072
# steps of a full run). The contenders on that path are held to this tolerance
# in the plain-SGD cells; mxoid to RTOL, ATOL everywhere.
STOCK_SGD = ("hand_stock_updater", "module_fit_acc", "module_fit_nometric", "feedforward")
STOCK_SGD_RTOL, STOCK_SGD_ATOL = 1e-3, 1e-4


def tolerance(contender: str, optimizer: str) -> tuple:
    """``(rtol, atol)`` for a contender's parameters against the hand loop's, in a cell."""
    if optimizer == "sgd" and contender in STOCK_SGD:
        return STOCK_SGD_RTOL, STOCK_SGD_ATOL
    return RTOL, ATOL


EXTENSION_US_PER_BATCH = 10.0
"""The most an everyday extension may add to a batch in the micro-benchmark (issue 13)."""

TARGETS_TEXT = (
    "ratios to the hand loop, Module.fit or Gluon in the same run, medians; for throughput "
    "ratios a 90% bootstrap interval over the runs and their timed epochs, and 'missed "
    "within noise' when "
    "the limit is inside it"
)


# ------------------------------------------------------------------ machine
def machine_info(mxoid_root: str = ROOT) -> Dict[str, object]:
    cpu = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        commit = subprocess.run(
            ["git", "-C", mxoid_root, "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
        ).stdout.strip()
        dirty = bool(
            subprocess.run(
                ["git", "-C", mxoid_root, "status", "--porcelain", "mxoid"],
                capture_output=True,
                text=True,
            ).stdout.strip()
        )
    except OSError:
        commit, dirty = "", False
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "mxoid_path": mxoid_root,
        "mxoid_commit": commit,
        "mxoid_uncommitted_changes": dirty,
    }


def _cpu_busy_seconds() -> float:
    """Seconds of CPU time spent busy by the whole machine since boot (all cores)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def wait_for_quiet(max_wait: float, threshold: float = 0.25, window: float = 0.5):
    """Wait until other processes keep less than ``threshold`` cores busy over ``window``
    seconds, or ``max_wait`` seconds passed; return (seconds waited, last load seen)."""
    start = time.perf_counter()
    while True:
        before = _cpu_busy_seconds()
        time.sleep(window)
        load = (_cpu_busy_seconds() - before) / window
        waited = time.perf_counter() - start
        if load < threshold or waited >= max_wait:
            return waited, load


class Launcher:
    """Starts workers: forked from a fork server that has imported MXNet (default), or
    as fresh interpreters (``spawn``), which adds about 3 s of MXNet import per worker.

    Either way each worker is a new process whose only state before training is
    the imported modules; mxoid is imported in the worker, from ``PYTHONPATH``.
    """

    def __init__(self, env: Dict[str, str], nice: int, spawn: bool) -> None:
        self.env, self.nice, self.spawn = env, nice, spawn
        self.context = None
        if not spawn:
            import multiprocessing

            # The fork server inherits this environment: the thread settings are in
            # place before it imports MXNet (through contenders.py).
            os.environ.update(env)
            self.context = multiprocessing.get_context("forkserver")
            self.context.set_forkserver_preload(["contenders"])
            # Start it now and wait until it has imported MXNet, so that the import is
            # in no worker's time.
            warm_up = self.context.Process(target=_no_op)
            warm_up.start()
            warm_up.join()

    def start(self, spec_path: str):
        if self.spawn:
            output = open(os.path.join(os.path.dirname(spec_path), "output.txt"), "w")
            process = subprocess.Popen(
                [sys.executable, os.path.join(HERE, "contenders.py"), spec_path],
                stdout=output,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=os.path.dirname(spec_path),
                preexec_fn=(lambda: os.nice(self.nice)) if self.nice else None,
            )
            output.close()
            return process
        paths = self.env["PYTHONPATH"].split(os.pathsep)
        process = self.context.Process(target=_forked_worker, args=(spec_path, self.nice, paths))
        process.start()
        return process


def _no_op() -> None:
    pass


def _forked_worker(spec_path: str, nice: int, paths: List[str]) -> None:
    """A worker's entry point in a process forked from the fork server."""
    sys.path[:0] = paths  # multiprocessing gave the worker this script's sys.path
    if nice:
        os.nice(nice)
    output = os.open(
        os.path.join(os.path.dirname(spec_path), "output.txt"),
        os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
    )
    os.dup2(output, 1)
    os.dup2(output, 2)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    os.chdir(os.path.dirname(spec_path))
    import contenders

    contenders.run_worker(spec_path)


def _exit_code(process) -> Optional[int]:
    """The exit status of a finished worker, None while it runs (Popen or Process)."""
    if isinstance(process, subprocess.Popen):
        return process.poll()
    return None if process.is_alive() else process.exitcode


class Job:
    """One contender in one cell: its worker process(es), work folder and result.

    With ``--max-load``, a worker disturbed by other processes is run again
    (in a new folder); the attempt with the least disturbance is kept.
    """

    def __init__(
        self,
        contender: str,
        model: str,
        batch: int,
        contexts: int,
        samples: int,
        epochs: int,
        root: str,
        repeat: int,
        optimizer: str = DEFAULT_OPTIMIZER,
    ) -> None:
        self.contender, self.model, self.batch, self.contexts = contender, model, batch, contexts
        self.samples, self.epochs, self.repeat = samples, epochs, repeat
        self.optimizer = optimizer
        self.root = os.path.join(
            root, f"{model}-{batch}-{contexts}-{optimizer}-{contender}-{repeat}"
        )
        self.attempts: List[dict] = []  # finished attempts: folder, result, load, error, wall
        self.workdir = ""
        self.process = None
        self.started = 0.0
        self.wall = 0.0
        self.busy_before = 0.0
        self.foreign_load = None  # CPU of other processes during the run, in cores
        self.waited, self.load_before = 0.0, None  # --wait-quiet: seconds waited, load then
        self.result: Optional[dict] = None
        self.error: Optional[str] = None
        self.killed = False  # by run_jobs, after --worker-timeout

    @property
    def cell(self):
        return (self.model, self.batch, self.contexts, self.optimizer)

    result_file = "result.json"

    def spec(self) -> dict:
        return {
            "contender": self.contender,
            "model": self.model,
            "batch_size": self.batch,
            "contexts": self.contexts,
            "optimizer": self.optimizer,
            "samples": self.samples,
            "epochs": self.epochs,
            "workdir": self.workdir,
        }

    def start(self, launcher: Launcher) -> None:
        self.workdir = os.path.join(self.root, f"attempt{len(self.attempts)}")
        os.makedirs(self.workdir)
        spec_path = os.path.join(self.workdir, "spec.json")
        with open(spec_path, "w") as f:
            json.dump(self.spec(), f)
        self.busy_before = _cpu_busy_seconds()
        self.started = time.perf_counter()
        self.process = launcher.start(spec_path)

    def finish(self, alone: bool, timeout: Optional[float] = None) -> None:
        """Collect the result of the ended worker; ``alone``: no other worker ran meanwhile."""
        wall = time.perf_counter() - self.started
        busy = _cpu_busy_seconds() - self.busy_before
        code = _exit_code(self.process)
        attempt = {
            "workdir": self.workdir,
            "wall": wall,
            "result": None,
            "error": None,
            "foreign_load": None,
            "timed_out": self.killed,
        }
        self.killed = False
        result_path = os.path.join(self.workdir, self.result_file)
        if code != 0 or not os.path.exists(result_path):
            with open(os.path.join(self.workdir, "output.txt")) as f:
                tail = f.read()[-3000:]
            last = [line for line in tail.splitlines() if line.strip()][-1:] or ["no output"]
            if attempt["timed_out"]:
                last = [f"killed after --worker-timeout {timeout:g} s (hung)"]
            attempt["error"] = f"worker exited with status {code}: {last[0]}\n{tail}"
        else:
            with open(result_path) as f:
                attempt["result"] = json.load(f)
            if alone and wall > 0:
                attempt["foreign_load"] = max(0.0, (busy - attempt["result"]["cpu_seconds"]) / wall)
        self.attempts.append(attempt)
        # Keep the least disturbed successful attempt (the latest failure if all failed).
        good = [a for a in self.attempts if a["result"] is not None]
        best = min(good, key=lambda a: a["foreign_load"] or 0.0) if good else attempt
        self.workdir, self.wall = best["workdir"], best["wall"]
        self.result, self.error, self.foreign_load = (
            best["result"],
            best["error"],
            best["foreign_load"],
        )

    def disturbed(self, max_load: Optional[float]) -> bool:
        return (
            max_load is not None and self.foreign_load is not None and self.foreign_load > max_load
        )

    def params(self) -> Dict[str, np.ndarray]:
        with np.load(os.path.join(self.workdir, "params.npz")) as data:
            return {k: data[k] for k in data.files}


class InterleavedJob(Job):
    """Every contender of a cell in one worker process, an epoch each in turn.

    The worker (``interleave.py``) writes each contender's result in a folder of
    its own; :meth:`members` gives them back as one finished :class:`Job` per
    contender, so that the analysis reads them as it reads separate workers.
    """

    result_file = "done.json"

    def __init__(self, contenders: Sequence[str], *cell_and_run: Any, order: str = "shuffle"):
        """``cell_and_run``: :class:`Job`'s arguments after the contender."""
        super().__init__("interleaved", *cell_and_run)
        self.contenders = list(contenders)
        self.order = order

    def spec(self) -> dict:
        return {
            **super().spec(),
            "contenders": self.contenders,
            "order": self.order,
            "repeat": self.repeat,
        }

    def members(self) -> List[Job]:
        """One finished Job per contender, from this worker's folder."""
        jobs = []
        for name in self.contenders:
            job = Job(
                name,
                self.model,
                self.batch,
                self.contexts,
                self.samples,
                self.epochs,
                os.path.dirname(self.root),
                self.repeat,
                self.optimizer,
            )
            job.workdir, job.wall = os.path.join(self.workdir, name), self.wall
            job.attempts, job.waited = self.attempts, self.waited
            job.foreign_load = self.foreign_load
            path = os.path.join(job.workdir, "result.json")
            if self.error is not None:
                job.error = self.error
            elif not os.path.exists(path):
                job.error = f"{name}: no result written by the interleaved worker"
            else:
                with open(path) as f:
                    job.result = json.load(f)
                if job.result.get("error"):
                    job.error = job.result["error"]
                    job.result = None
            jobs.append(job)
        return jobs


def take_memory(rows: List[dict], memory_rows: List[dict]) -> None:
    """Give the rows of the interleaved pass the peaks of the memory pass (same contender,
    same cell): contenders sharing a process cannot be told apart by its memory."""
    peaks = {
        (r["contender"],) + cell_of(r): r for r in memory_rows if r.get("peak_rss_mib") is not None
    }
    for row in rows:
        source = peaks.get((row["contender"],) + cell_of(row))
        if source is not None and "samples_per_second" in row:
            row["peak_rss_mib"] = source["peak_rss_mib"]
            row["peak_over_start_mib"] = source["peak_over_start_mib"]
            row["memory_from"] = "a process of its own (memory pass)"


def worker_env(mxoid_root: str = ROOT) -> Dict[str, str]:
    env = dict(os.environ)
    env.update(WORKER_ENV)
    paths = [mxoid_root, HERE] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


def run_jobs(
    jobs: List[Job],
    parallel: int,
    launcher: Launcher,
    quiet: bool,
    quiet_wait: float = 0.0,
    max_load: Optional[float] = None,
    retries: int = 0,
    worker_timeout: Optional[float] = None,
) -> None:
    """Run the jobs, ``parallel`` at a time; a worker still running after
    ``worker_timeout`` seconds is killed (a hung process) and run once more."""
    pending, running, done = list(jobs), [], 0
    try:
        while pending or running:
            while pending and len(running) < parallel:
                job = pending.pop(0)
                if quiet_wait > 0 and parallel == 1:
                    job.waited, job.load_before = wait_for_quiet(quiet_wait)
                job.start(launcher)
                running.append(job)
            if worker_timeout is not None:
                for job in running:
                    if time.perf_counter() - job.started > worker_timeout and not job.killed:
                        job.killed = True
                        job.process.kill()
            finished = [j for j in running if _exit_code(j.process) is not None]
            if not finished:
                time.sleep(0.02)
                continue
            for job in finished:
                running.remove(job)
                if not isinstance(job.process, subprocess.Popen):
                    job.process.join()
                job.finish(alone=parallel == 1, timeout=worker_timeout)
                again = (job.disturbed(max_load) and len(job.attempts) <= retries) or (
                    job.attempts[-1]["timed_out"] and len(job.attempts) < 2
                )
                if not quiet:
                    note = f" -> again (attempt {len(job.attempts) + 1})" if again else ""
                    print(
                        f"[{done + 1:>2}/{len(jobs)}] {describe_cell(job.cell):<22} "
                        f"{job.contender:<20} {_progress_summary(job.attempts[-1], job.samples)}"
                        f"{note}",
                        flush=True,
                    )
                if again:
                    pending.insert(0, job)
                else:
                    done += 1
    finally:
        for job in running:  # interrupted: leave no worker behind
            job.process.terminate()


def _progress_summary(attempt: dict, samples: int) -> str:
    if attempt["error"]:
        return "FAILED"
    if attempt["result"].get("interleaved"):
        return f"{attempt['result']['rounds']} rounds ({attempt['wall']:.1f} s)"
    rates = samples / timed_epochs(attempt["result"])
    load = attempt["foreign_load"]
    load = "" if load is None else f", other load {load:.2f} cores"
    return f"{float(np.median(rates)):>9,.0f} samples/s ({attempt['wall']:.1f} s{load})"


# ------------------------------------------------------------------ analysis
def describe_cell(cell) -> str:
    model, batch, contexts, *optimizer = cell
    optimizer = OPTIMIZER_LABELS[optimizer[0] if optimizer else DEFAULT_OPTIMIZER]
    return f"{'MLP' if model == 'mlp' else 'LeNet'} b{batch} {contexts} ctx{optimizer}"


def cell_of(row: dict) -> tuple:
    """The cell of a result row (rows of results files from before the optimizer: momentum)."""
    return (
        row["model"],
        row["batch_size"],
        row["contexts"],
        row.get("optimizer", DEFAULT_OPTIMIZER),
    )


STAMPS = {"wall": "epoch_stamps", "cpu": "epoch_cpu_stamps", "host": "epoch_thread_stamps"}
DURATIONS = {"wall": "epoch_seconds", "cpu": "epoch_cpu_seconds", "host": "epoch_host_seconds"}


def timed_epochs(result: dict, clock: str = "wall") -> np.ndarray:
    """A worker's timed epochs in seconds: wall-clock, CPU of the process, or host thread.

    A worker of its own stamps the start and every epoch end (the first epoch is
    the warm-up); a contender trained in turns (``interleave.py``) reports the
    duration of each of its timed turns, in round order.
    """
    if result.get("interleaved"):
        return np.asarray(result[DURATIONS[clock]], dtype=np.float64)
    return np.diff(result[STAMPS[clock]])[1:]


def epoch_stats(job: Job) -> Dict[str, float]:
    rates = job.samples / timed_epochs(job.result)
    return {
        "median": float(np.median(rates)),
        "min": float(rates.min()),
        "max": float(rates.max()),
        "q1": float(np.percentile(rates, 25)),
        "q3": float(np.percentile(rates, 75)),
    }


def pooled_rates(jobs: Sequence[Job]) -> np.ndarray:
    return np.concatenate([job.samples / timed_epochs(job.result) for job in jobs])


def warmup_seconds(result: dict) -> float:
    if result.get("interleaved"):
        return float(result["warmup_seconds"])
    return float(np.diff(result["epoch_stamps"])[0])


def peak_mib(group: Sequence[Job]) -> float:
    return max(j.result["peak_rss_kib"] for j in group) / 1024


def peak_over_start_mib(group: Sequence[Job]) -> float:
    return max(j.result["peak_rss_kib"] - j.result["rss_before_training_kib"] for j in group) / 1024


def analyse(jobs: List[Job], contenders: Sequence[str]) -> List[dict]:
    """One row per contender and cell: throughput, ratios, overhead, memory, correctness."""
    rows = []
    cells = []
    for job in jobs:
        if job.cell not in cells:
            cells.append(job.cell)
    for cell in cells:
        by_contender: Dict[str, List[Job]] = {}
        for job in jobs:
            if job.cell == cell:
                by_contender.setdefault(job.contender, []).append(job)
        medians = {}
        for name, group in by_contender.items():
            if all(j.result for j in group):
                medians[name] = float(np.median(pooled_rates(group)))
        hand_params = None
        hand_jobs = by_contender.get("hand", [])
        if hand_jobs and hand_jobs[0].result:
            hand_params = hand_jobs[0].params()
        for name in contenders:
            group = by_contender.get(name)
            if not group:
                continue
            model, batch, contexts, optimizer = cell
            row = {
                "contender": name,
                "label": LABELS[name],
                "model": model,
                "batch_size": batch,
                "contexts": contexts,
                "optimizer": optimizer,
                "samples_per_epoch": group[0].samples,
                "batches_per_epoch": -(-group[0].samples // batch),
                "timed_epochs": group[0].epochs - 1,
                "runs": len(group),
                "errors": [j.error for j in group if j.error],
            }
            rows.append(row)
            if row["errors"]:
                continue
            rates = pooled_rates(group)
            median = medians[name]
            interleaved = all(j.result.get("interleaved") for j in group)
            row.update(
                {
                    "samples_per_second": {
                        "median": median,
                        "min": float(rates.min()),
                        "max": float(rates.max()),
                        "q1": float(np.percentile(rates, 25)),
                        "q3": float(np.percentile(rates, 75)),
                    },
                    "interleaved": interleaved,
                    "epoch_seconds": [list(timed_epochs(j.result)) for j in group],
                    "epoch_host_seconds": [list(timed_epochs(j.result, "host")) for j in group],
                    "cpu_us_per_batch": float(
                        np.median(np.concatenate([timed_epochs(j.result, "cpu") for j in group]))
                    )
                    * 1e6
                    / -(-group[0].samples // batch),
                    "host_us_per_batch": float(
                        np.median(np.concatenate([timed_epochs(j.result, "host") for j in group]))
                    )
                    * 1e6
                    / -(-group[0].samples // batch),
                    "warmup_seconds": [warmup_seconds(j.result) for j in group],
                    "ratio_to_hand": median / medians["hand"] if "hand" in medians else None,
                    "ratio_to_module_fit": (
                        median / medians["module_fit_acc"] if "module_fit_acc" in medians else None
                    ),
                    "overhead_us_per_batch": (
                        1e6 * batch * (1 / median - 1 / medians["hand"])
                        if "hand" in medians
                        else None
                    ),
                    "peak_rss_mib": None if interleaved else peak_mib(group),
                    "peak_over_start_mib": None if interleaved else peak_over_start_mib(group),
                    "other_load_cores": (
                        max(j.foreign_load for j in group)
                        if all(j.foreign_load is not None for j in group)
                        else None
                    ),
                    "waited_for_quiet_seconds": sum(j.waited for j in group),
                    "attempts": sum(len(j.attempts) for j in group),
                    "notes": sorted({n for j in group for n in j.result["notes"]}),
                }
            )
            finite = all(j.result["finite"] for j in group)
            row["finite"] = finite
            row["expected_equal_to_hand"] = name in EQUAL_TO_HAND
            if hand_params is not None and name != "hand":
                rtol, atol = tolerance(name, optimizer)
                row["rtol"], row["atol"] = rtol, atol
                diffs, equal = [], True
                for job in group:
                    params = job.params()
                    if params.keys() != hand_params.keys():
                        diffs.append(float("inf"))
                        equal = False
                        continue
                    diffs.append(
                        max(float(np.abs(params[k] - hand_params[k]).max()) for k in hand_params)
                    )
                    equal = equal and all(
                        np.allclose(params[k], hand_params[k], rtol=rtol, atol=atol)
                        for k in hand_params
                    )
                row["max_abs_diff_to_hand"] = max(diffs)
                row["equal_to_hand"] = equal
    pair_ratios(rows)
    return rows


def throughput_ratio(row: dict, other: dict) -> Tuple[float, Optional[Tuple[float, float]]]:
    """``row``'s throughput over ``other``'s, and its 90% interval (None without epochs).

    Contenders trained in turns in the same processes: the median of the
    round-by-round ratios (:func:`intervals.paired_ratio`); otherwise the ratio
    of the median throughputs (:func:`intervals.ratio_interval`).
    """
    paired = paired_ratio(row, other)
    if paired is not None:
        return paired
    ratio = row["samples_per_second"]["median"] / other["samples_per_second"]["median"]
    return ratio, ratio_interval(row, other)


def pair_ratios(rows: List[dict]) -> None:
    """Give the rows of interleaved runs their round-by-round ratios to the hand loop and
    Module.fit (and the overhead per batch that follows from the ratio to the hand loop)."""
    index = {(r["contender"],) + cell_of(r): r for r in rows if "samples_per_second" in r}
    for (_, *cell), row in index.items():
        if not row.get("interleaved"):
            continue
        hand = index.get(("hand", *cell))
        module = index.get(("module_fit_acc", *cell))
        if hand is not None and hand.get("interleaved"):
            ratio, _ = throughput_ratio(row, hand)
            row["ratio_to_hand"] = ratio
            batch = row["batch_size"]
            row["overhead_us_per_batch"] = (
                1e6 * batch / hand["samples_per_second"]["median"] * (1 / ratio - 1)
            )
        if module is not None and module.get("interleaved"):
            row["ratio_to_module_fit"] = throughput_ratio(row, module)[0]


def correctness(rows: List[dict]) -> dict:
    failures = []
    for row in rows:
        where = f"{row['contender']} in {describe_cell(cell_of(row))}"
        if row["errors"]:
            failures.append(f"{where}: {row['errors'][0].splitlines()[0]}")
        elif not row["finite"]:
            failures.append(f"{where}: non-finite parameters")
        elif row["expected_equal_to_hand"] and row.get("equal_to_hand") is False:
            failures.append(
                f"{where}: parameters differ from the hand loop's "
                f"(max |diff| {row['max_abs_diff_to_hand']:.3g}, "
                f"rtol {row.get('rtol', RTOL)}, atol {row.get('atol', ATOL)})"
            )
        elif row["expected_equal_to_hand"] and "equal_to_hand" not in row:
            failures.append(f"{where}: no hand-loop result to compare with")
    return {
        "ok": not failures,
        "failures": failures,
        "rtol": RTOL,
        "atol": ATOL,
        "stock_sgd": {
            "contenders": list(STOCK_SGD),
            "rtol": STOCK_SGD_RTOL,
            "atol": STOCK_SGD_ATOL,
        },
        "equal_to_hand_expected_for": list(EQUAL_TO_HAND),
    }


def targets(rows: List[dict], micro: Optional[dict]) -> List[dict]:
    """The speed and memory targets, for the cells this run has.

    Issue 13's: on the MLP (batch 32 and 128, one and two contexts, every
    optimizer) mxoid with the everyday extensions at least 0.95 of the hand loop
    and bare at least 0.98; the Python thread's host time per batch on MLP b32 at
    most 1.1x the hand loop's (everyday) and 1.05x (bare); mxoid at least 1.5x
    ``Module.fit`` with accuracy on MLP b32, and ahead of the Gluon loop in every
    cell. Older ones kept: bare at least 0.95 and everyday 0.98 on LeNet b128
    two contexts (compute-bound), bare at least 0.95 on LeNet; peak memory at
    most Module.fit's + 10% + the inputs mxoid may queue ahead of the devices
    (64 MiB, ``mxoid.pacing.QUEUED_INPUT_BUDGET``); hook dispatch at most 2 us
    per extension; each everyday extension at most 10 us per batch over the bare
    loop in the micro-benchmark (its wall-clock difference, with its interval).
    """
    index = {(r["contender"],) + cell_of(r): r for r in rows if "samples_per_second" in r}
    found = []

    def add(
        target: str,
        measured: float,
        limit: float,
        unit: str,
        at_most: bool = False,
        versus: Optional[Tuple[dict, dict]] = None,
    ):
        interval = None
        if versus is not None:  # a ratio of throughputs: how sure the verdict is
            measured, interval = throughput_ratio(*versus)
        met = measured <= limit if at_most else measured >= limit
        entry = {"target": target, "measured": measured, "limit": limit, "met": met, "unit": unit}
        if interval is not None:
            entry["interval"] = interval
            entry["within_noise"] = interval[0] <= limit <= interval[1]
        found.append(entry)

    mxoid = ("mxoid_bare", "mxoid_everyday")
    for (contender, *cell), row in sorted(index.items()):
        cell = tuple(cell)
        model, batch = cell[0], cell[1]
        where = f"{LABELS.get(contender, contender)}, {describe_cell(cell)}"
        if contender in mxoid and row["ratio_to_hand"] is not None:
            if model == "mlp":
                limit = 0.98 if contender == "mxoid_bare" else 0.95
            elif cell == ("lenet", 128, 2, DEFAULT_OPTIMIZER):
                limit = 0.98
            else:
                limit = 0.95 if contender == "mxoid_bare" else None
            hand = index.get(("hand",) + cell)
            if limit is not None:
                add(
                    f"{where}: >= {limit:.0%} of hand",
                    row["ratio_to_hand"],
                    limit,
                    "%",
                    versus=(row, hand) if hand else None,
                )
        hand = index.get(("hand",) + cell)
        if contender in mxoid and model == "mlp" and batch == 32 and hand is not None:
            limit = 1.05 if contender == "mxoid_bare" else 1.10
            if hand["host_us_per_batch"] > 0:
                # round by round where both trained in turns, as the throughput ratios
                paired = paired_time_ratio(row, hand)
                add(
                    f"{where}: Python thread's host time per batch <= {limit:.2f}x hand's",
                    paired
                    if paired is not None
                    else row["host_us_per_batch"] / hand["host_us_per_batch"],
                    limit,
                    "x",
                    at_most=True,
                )
            module = index.get(("module_fit_acc",) + cell)
            if row["ratio_to_module_fit"] is not None:
                add(
                    f"{where}: >= 1.5x Module.fit, accuracy",
                    row["ratio_to_module_fit"],
                    1.5,
                    "x",
                    versus=(row, module) if module else None,
                )
                if module is not None:  # how far a loop doing the least work gets
                    found[-1]["floor"] = throughput_ratio(hand, module)[0]
        gluon = index.get(("gluon",) + cell)
        if contender in mxoid and gluon is not None:
            add(
                f"{where}: ahead of the Gluon loop (x Gluon >= 1.00x)",
                row["samples_per_second"]["median"] / gluon["samples_per_second"]["median"],
                1.0,
                "x",
                versus=(row, gluon),
            )
        module = index.get(("module_fit_acc",) + cell)
        if contender in mxoid and module is not None and module["peak_rss_mib"] is not None:
            # Module.fit with a metric reads every batch, so it never runs ahead; mxoid
            # may queue up to QUEUED_INPUT_MIB of inputs ahead (max_batches_ahead='auto').
            limit = module["peak_rss_mib"] * 1.10 + QUEUED_INPUT_MIB
            add(
                f"{where}: peak memory <= Module.fit's + 10% + the {QUEUED_INPUT_MIB} MiB "
                f"mxoid may queue ({limit:.0f} MiB)",
                row["peak_rss_mib"],
                limit,
                "MiB",
                at_most=True,
            )
    for entry in (micro or {}).get("per_batch", ()):
        name = entry["name"]
        if name.startswith("+ ") and name != "+ all everyday" and "us_per_batch_interval" in entry:
            low, high = entry["us_per_batch_interval"]
            found.append(
                {
                    "target": f"micro, {entry['cell']}, {name[2:]}: <= "
                    f"{EXTENSION_US_PER_BATCH:.0f} us per batch over the bare loop",
                    "measured": entry["us_per_batch"],
                    "limit": EXTENSION_US_PER_BATCH,
                    "met": entry["us_per_batch"] <= EXTENSION_US_PER_BATCH,
                    "unit": "us",
                    "interval": [low, high],
                    "within_noise": low <= EXTENSION_US_PER_BATCH <= high,
                }
            )
    if micro and "dispatch" in micro:
        for entry in micro["dispatch"]:
            found.append(
                {
                    "target": f"hook dispatch, {entry['extensions']} {entry['style']} "
                    "extensions: <= 2 us per extension per hook",
                    "measured": entry["us_per_extension"],
                    "limit": 2.0,
                    "met": entry["us_per_extension"] <= 2.0,
                    "unit": "us",
                }
            )
    return found


# ------------------------------------------------------------------- output
def format_table(rows: List[dict], mode: str) -> str:
    lines = []
    header = (
        f"{'contender':<27}{'samples/s':>10}{'min-max':>17}{'x hand':>8}{'x Module':>9}"
        f"{'us/batch':>10}{'CPU us/b':>9}{'host us/b':>10}{'peak MiB':>9}{'+MiB':>6}"
        f"{'params':>8}{'load':>6}"
    )
    cell = None
    for row in rows:
        this = cell_of(row)
        if this != cell:
            cell = this
            design = (
                f", in turns: {row['runs']} process(es) of {row['timed_epochs']} rounds"
                if row.get("interleaved")
                else f", warm-up + {row['timed_epochs']} timed epochs"
                + (f", {row['runs']} runs pooled" if row["runs"] > 1 else "")
            )
            lines += [
                "",
                f"{describe_cell(cell)}: {row['samples_per_epoch']} samples/epoch, "
                f"{row['batches_per_epoch']} batches{design}",
                header,
                "-" * len(header),
            ]
        if row["errors"]:
            lines.append(f"{row['label']:<27}  FAILED: {row['errors'][0].splitlines()[0]}")
            continue
        sps = row["samples_per_second"]
        spread = f"{sps['min']:,.0f}-{sps['max']:,.0f}"

        def number(value, fmt):
            return "-" if value is None else format(value, fmt)

        if row["contender"] == "hand":
            params = "ref"
        elif not row["finite"]:
            params = "NONFIN"
        elif "equal_to_hand" not in row:
            params = "?"
        elif row["equal_to_hand"]:
            params = "equal"
        else:
            params = (
                "DIFF" if row["expected_equal_to_hand"] else f"{row['max_abs_diff_to_hand']:.0e}"
            )
        load = number(row["other_load_cores"], ".2f")
        lines.append(
            f"{row['label']:<27}{sps['median']:>10,.0f}{spread:>17}"
            f"{number(row['ratio_to_hand'], '.2f'):>8}"
            f"{number(row['ratio_to_module_fit'], '.2f'):>9}"
            f"{number(row['overhead_us_per_batch'], '+.0f'):>10}{row['cpu_us_per_batch']:>9.0f}"
            f"{number(row.get('host_us_per_batch'), '.0f'):>10}"
            f"{number(row['peak_rss_mib'], '.0f'):>9}"
            f"{number(row['peak_over_start_mib'], '.0f'):>6}{params:>8}{load:>6}"
        )
    notes = sorted({n for row in rows for n in row.get("notes", ())})
    if notes:
        lines += ["", "Notes from the workers:"] + [f"  - {n}" for n in notes]
    if mode == "check":
        lines += [
            "",
            "(--check runs two workers at once on tiny epochs: the speed columns mean nothing)",
        ]
    return "\n".join(lines)


def format_micro(micro: dict) -> str:
    lines = ["", "Micro-benchmark (benchmarks/micro.py)"]
    for entry in micro.get("dispatch", ()):
        lines.append(
            f"  dispatch one hook to {entry['extensions']:>2} {entry['style']:<26} extensions: "
            f"{entry['us_per_hook']:7.2f} us per hook, "
            f"{entry['us_per_extension']:.3f} us per extension"
        )
    for entry in micro.get("per_batch", ()):
        lines.append(
            f"  {entry['cell']} {entry['name']:<34} {entry['us_per_batch']:+8.1f} us/batch wall"
            f"{micro_interval(entry)}, "
            f"{entry['cpu_us_per_batch']:+8.1f} CPU; {entry['hook_us_per_batch']:6.1f} us in "
            f"its per-batch hooks; throughput {micro_ratio(entry)} of the bare loop's"
        )
    for note in micro.get("notes", ()):
        lines.append(f"  note: {note}")
    return "\n".join(lines)


def micro_interval(entry: dict) -> str:
    """A micro-benchmark variant's wall-clock cost per batch: its interval, where it has one."""
    if "us_per_batch_interval" not in entry:  # results of earlier runs
        return ""
    low, high = entry["us_per_batch_interval"]
    return f" (90%: {low:+.1f} to {high:+.1f})"


def micro_ratio(entry: dict) -> str:
    """A micro-benchmark variant's throughput over the bare loop's, with its interval."""
    ratio = entry.get("throughput_vs_bare")
    if ratio is None:
        return "-"
    low, high = entry["throughput_vs_bare_interval"]
    return f"{ratio:.2f} (90%: {low:.2f}-{high:.2f})"


def format_markdown(report: dict) -> str:
    """The report as Markdown: machine, command, one table of every cell, targets."""
    machine = report["machine"]
    lines = [
        f"Run of {report['date']}: `python {report['command']}` "
        f"({report['seconds'] / 60:.0f} min), "
        f"{machine['nproc']} CPUs ({machine['cpu']}), Python {machine['python']}, MXNet "
        f"{report['mxnet']}, mxoid {machine['mxoid_commit']}"
        f"{' with uncommitted changes' if machine['mxoid_uncommitted_changes'] else ''}.",
        "",
        "| cell | contender | samples/s | min-max | x hand | x Module | us/batch | CPU us/b "
        "| host us/b | peak MiB | +MiB | params | load |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for row in report["results"]:
        cell = describe_cell(cell_of(row))
        if row["errors"]:
            lines.append(f"| {cell} | {row['label']} | failed | | | | | | | | | |")
            continue
        sps = row["samples_per_second"]

        def number(value, fmt):
            return "-" if value is None else format(value, fmt)

        params = (
            "ref"
            if row["contender"] == "hand"
            else "equal"
            if row.get("equal_to_hand")
            else f"{row.get('max_abs_diff_to_hand', float('nan')):.0e}"
        )
        lines.append(
            f"| {cell} | {row['label']} | {sps['median']:,.0f} "
            f"| {sps['min']:,.0f}-{sps['max']:,.0f} "
            f"| {number(row['ratio_to_hand'], '.2f')} "
            f"| {number(row['ratio_to_module_fit'], '.2f')} "
            f"| {number(row['overhead_us_per_batch'], '+.0f')} | {row['cpu_us_per_batch']:,.0f} "
            f"| {number(row.get('host_us_per_batch'), ',.0f')} "
            f"| {number(row['peak_rss_mib'], '.0f')} | {number(row['peak_over_start_mib'], '.0f')} "
            f"| {params} "
            f"| {number(row['other_load_cores'], '.2f')} |"
        )
    micro = report.get("micro") or {}
    if micro.get("per_batch"):
        lines += [
            "",
            "| micro: per-batch cost | wall us/batch | CPU us/batch "
            "| host us in its per-batch hooks | throughput x bare |",
            "|---|---:|---:|---:|---:|",
        ]
        for entry in micro["per_batch"]:
            lines.append(
                f"| {entry['cell']} {entry['name']} | {entry['us_per_batch']:+.0f}"
                f"{micro_interval(entry)} "
                f"| {entry['cpu_us_per_batch']:+.0f} | {entry['hook_us_per_batch']:.0f} "
                f"| {micro_ratio(entry)} |"
            )
    if report["targets"]:
        lines += ["", "| target | measured | met |", "|---|---:|---|"]
        for entry in report["targets"]:
            lines.append(
                f"| {entry['target']} | {format_measured(entry)} "
                f"| {VERDICT_CELLS[verdict(entry)]} |"
            )
    return "\n".join(lines) + "\n"


QUEUED_INPUT_MIB = 64
"""mxoid.pacing.QUEUED_INPUT_BUDGET in MiB (the runner imports no MXNet, nor mxoid)."""


VERDICT_CELLS = {
    "met": "yes",
    "MISSED": "**no**",
    "missed within noise": "no, within noise",
    "missed by the floor too": "no, nor by the hand loop",
}


def verdict(entry: dict) -> str:
    """``met``, ``MISSED``, ``missed within noise`` (the limit inside the ratio's interval),
    or ``missed by the floor too`` (the hand loop, which does the least work, misses it)."""
    if entry["met"]:
        return "met"
    if entry.get("floor") is not None and entry["floor"] < entry["limit"]:
        return "missed by the floor too"
    return "missed within noise" if entry.get("within_noise") else "MISSED"


def format_measured(entry: dict) -> str:
    """A target's measured value in its unit (results files without units: by the target's text)."""
    unit = entry.get("unit") or (
        "MiB" if "MiB" in entry["target"] else "us" if "us per" in entry["target"] else "%"
    )
    measured = entry["measured"]
    text = {
        "MiB": f"{measured:.0f} MiB",
        "us": f"{measured:.2f} us",
        "x": f"{measured:.2f}x",
    }.get(unit, f"{measured:.1%}")
    if "interval" in entry:
        low, high = entry["interval"]
        text += {
            "%": f" (90%: {low:.0%}-{high:.0%})",
            "us": f" (90%: {low:.1f} to {high:.1f} us)",
        }.get(unit, f" (90%: {low:.2f}-{high:.2f}x)")
    if entry.get("floor") is not None:
        text += f"; the hand loop: {entry['floor']:.2f}x"
    return text


def format_targets(found: List[dict]) -> str:
    lines = ["", f"Targets ({TARGETS_TEXT})"]
    for entry in found:
        lines.append(f"  {verdict(entry):<20}{entry['target']}: {format_measured(entry)}")
    return "\n".join(lines)


def run_micro(args: List[str], env: Dict[str, str], root: str, nice: int = 0) -> Optional[dict]:
    path = os.path.join(root, "micro.json")
    completed = subprocess.run(
        [sys.executable, os.path.join(HERE, "micro.py"), "--json", path, *args],
        env=env,
        capture_output=True,
        text=True,
        preexec_fn=(lambda: os.nice(nice)) if nice else None,
    )
    if completed.returncode != 0 or not os.path.exists(path):
        print(
            f"micro.py failed with status {completed.returncode}:\n{completed.stdout[-2000:]}"
            f"{completed.stderr[-2000:]}",
            file=sys.stderr,
        )
        return None
    with open(path) as f:
        return json.load(f)


# ---------------------------------------------------------------------- main
def parse_cells(text: str):
    """``mlp-32-1,mlp-32-2-adam`` -> cells (the optimizer defaults to momentum SGD)."""
    cells = []
    for item in text.split(","):
        model, batch, contexts, *optimizer = item.split("-")
        optimizer = optimizer[0] if optimizer else DEFAULT_OPTIMIZER
        if optimizer not in OPTIMIZER_LABELS:
            raise ValueError(
                f"cell {item!r}: unknown optimizer {optimizer!r}; "
                f"choose from {sorted(OPTIMIZER_LABELS)}"
            )
        cells.append((model, int(batch), int(contexts), optimizer))
    return tuple(cells)


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--quick", action="store_true", help="the target cells, short epochs (< 2 min)"
    )
    group.add_argument(
        "--check",
        action="store_true",
        help="correctness only: tiny epochs, every contender, two workers at once",
    )
    parser.add_argument(
        "--json",
        default=None,
        help=f"where to write the results (default {os.path.relpath(DEFAULT_JSON)})",
    )
    parser.add_argument(
        "--markdown",
        metavar="PATH",
        help="also write the table and targets as Markdown (for the README)",
    )
    parser.add_argument(
        "--report",
        metavar="JSON",
        help="run nothing: print the Markdown of a results file (to --markdown or stdout)",
    )
    parser.add_argument("--contenders", help="comma-separated subset, e.g. hand,mxoid_bare")
    parser.add_argument(
        "--cells",
        help="comma-separated model-batch-contexts[-optimizer], e.g. mlp-32-1,lenet-128-2,"
        "mlp-32-2-adam (optimizers: momentum, the default; sgd; adam)",
    )
    parser.add_argument(
        "--separate",
        action="store_true",
        help="time every contender in processes of its own, one after the other (before "
        "2026-12-02 the only design), instead of all of a cell's contenders in one process, "
        "an epoch each in turn",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        help="processes per cell (default: 3 in a full run, 1 with --quick); with --separate, "
        "run every worker this many times, interleaved, and pool the epochs (default 1)",
    )
    parser.add_argument(
        "--timed-epochs",
        type=int,
        help="timed epochs of each contender after the warm-up (the rounds of a process)",
    )
    parser.add_argument(
        "--order",
        choices=("shuffle", "rotate"),
        default="shuffle",
        help="the contenders' order in each round: drawn for each pair of timed rounds and "
        "reversed in the second (the default), or rotated by one",
    )
    parser.add_argument(
        "--no-memory",
        action="store_true",
        help="skip the memory pass (each contender in a process of its own, for its peak)",
    )
    parser.add_argument("--samples", type=int, help="samples per epoch, for every model")
    parser.add_argument(
        "--wait-quiet",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="before each worker, wait (at most SECONDS) until other processes "
        "use less than a quarter of a core",
    )
    parser.add_argument(
        "--max-load",
        type=float,
        metavar="CORES",
        help="run a worker again when other processes used more than CORES "
        "cores during its run (see --retries); the least disturbed run is kept",
    )
    parser.add_argument(
        "--retries",
        type=int,
        default=2,
        help="with --max-load: at most this many runs more per worker (default 2)",
    )
    parser.add_argument(
        "--spawn",
        action="store_true",
        help="start every worker as a fresh interpreter instead of forking it "
        "from a server that has imported MXNet (slower by ~3 s a worker)",
    )
    parser.add_argument(
        "--nice",
        type=int,
        default=0,
        help="run the workers at this niceness (negative, as root: ahead of "
        "other processes on a shared machine)",
    )
    parser.add_argument(
        "--mxoid",
        default=ROOT,
        metavar="PATH",
        help="the folder holding the mxoid package the workers import "
        "(default: this checkout), e.g. a git worktree of another commit",
    )
    parser.add_argument(
        "--worker-timeout",
        type=float,
        default=600.0,
        metavar="SECONDS",
        help="kill a worker still running after SECONDS (a hung process: a FeedForward "
        "worker deadlocked once here) and run it once more (default 600)",
    )
    parser.add_argument("--no-micro", action="store_true", help="skip the micro-benchmark")
    parser.add_argument("--keep", action="store_true", help="keep the workers' folders")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    args = parser.parse_args(argv)

    if args.report:
        with open(args.report) as f:
            report = json.load(f)
        report.setdefault("mxnet", "1.9.1")
        text = format_markdown(report)
        if args.markdown:
            with open(args.markdown, "w") as f:
                f.write(text)
        else:
            print(text, end="")
        return 0
    mode = "quick" if args.quick else "check" if args.check else "full"
    config = dict(MODES[mode])
    contenders = list(config["contenders"])
    if args.contenders:
        contenders = args.contenders.split(",")
        known = ALL_CONTENDERS + EXTRA_CONTENDERS
        unknown = sorted(set(contenders) - set(known))
        if unknown:
            parser.error(f"unknown contenders {unknown}; choose from {list(known)}")
        if "hand" not in contenders:
            contenders.insert(0, "hand")  # the reference for ratios and parameters
    try:
        cells = parse_cells(args.cells) if args.cells else config["cells"]
    except ValueError as error:
        parser.error(str(error))
    timed = args.timed_epochs or config["timed_epochs"]
    samples = {m: args.samples or n for m, n in config["samples"].items()}
    adam_samples = config["adam_samples"]
    if args.samples:
        adam_samples = args.samples
    elif isinstance(adam_samples, int):
        adam_samples = {batch: adam_samples for batch in (32, 128)}
    interleaved = not args.separate
    repeat = args.repeat or (config["processes"] if interleaved else 1)
    memory = config["memory"] and not args.no_memory

    def samples_of(cell) -> int:
        if cell[3] == "adam":
            return adam_samples if isinstance(adam_samples, int) else adam_samples[cell[1]]
        return samples[cell[0]]

    mxoid_root = os.path.abspath(args.mxoid)
    if not os.path.isfile(os.path.join(mxoid_root, "mxoid", "__init__.py")):
        parser.error(f"--mxoid {args.mxoid}: no mxoid/__init__.py there")
    env = worker_env(mxoid_root)
    machine = machine_info(mxoid_root)
    launcher = Launcher(env, args.nice, args.spawn)
    print(
        f"mxoid benchmark, mode {mode}: {machine['nproc']} CPUs ({machine['cpu']}), "
        f"Python {machine['python']}, mxoid {machine['mxoid_commit']}"
        f"{' + uncommitted changes' if machine['mxoid_uncommitted_changes'] else ''}",
        flush=True,
    )

    signal.signal(signal.SIGTERM, _interrupt)
    root = tempfile.mkdtemp(prefix="mxoid-bench-")
    started = time.perf_counter()
    try:

        def separate_jobs(epochs: int, folder: str) -> List[Job]:
            return [
                Job(contender, *cell[:3], samples_of(cell), epochs, folder, r, cell[3])
                for r in range(repeat if not interleaved else 1)
                for cell in cells
                for contender in contenders
            ]

        def run(batch_of_jobs: List[Job]) -> None:
            run_jobs(
                batch_of_jobs,
                config["parallel"],
                launcher,
                args.quiet,
                args.wait_quiet,
                args.max_load,
                args.retries,
                args.worker_timeout,
            )

        def in_order(group: List[Job]) -> List[Job]:
            return sorted(
                group, key=lambda j: (cells.index(j.cell), contenders.index(j.contender), j.repeat)
            )

        if interleaved:
            workers = [
                InterleavedJob(
                    contenders,
                    *cell[:3],
                    samples_of(cell),
                    1 + timed,
                    root,
                    r,
                    cell[3],
                    order=args.order,
                )
                for r in range(repeat)
                for cell in cells
            ]
            if not args.quiet:
                print(
                    f"Throughput: every contender of a cell in one process, an epoch each in "
                    f"turn, {timed} rounds, {repeat} process(es) per cell",
                    flush=True,
                )
            run(workers)
            jobs = in_order([member for worker in workers for member in worker.members()])
        else:
            jobs = separate_jobs(1 + timed, root)
            run(jobs)
            jobs = in_order(jobs)
        rows = analyse(jobs, contenders)
        check = correctness(rows)
        memory_jobs: List[Job] = []
        if interleaved and memory:
            if not args.quiet:
                print(
                    "Memory: every contender in a process of its own, a warm-up and "
                    f"{config['memory_timed_epochs']} timed epoch(s)",
                    flush=True,
                )
            memory_jobs = separate_jobs(
                1 + config["memory_timed_epochs"], os.path.join(root, "memory")
            )
            run(memory_jobs)
            memory_rows = analyse(in_order(memory_jobs), contenders)
            take_memory(rows, memory_rows)
            memory_check = correctness(memory_rows)
            check["failures"] += [f"memory pass: {f}" for f in memory_check["failures"]]
            check["ok"] = check["ok"] and memory_check["ok"]
        micro = None if args.no_micro else run_micro(config["micro"], env, root, args.nice)
        found = targets(rows, micro)
        print(format_table(rows, mode))
        print(
            "\nCorrectness: "
            + (
                "every contender finite; every contender that computes the same "
                "thing as the hand loop ends with its parameters "
                f"(rtol {RTOL}, atol {ATOL}; MXNet's stock updater with plain SGD: "
                f"rtol {STOCK_SGD_RTOL}, atol {STOCK_SGD_ATOL})"
                if check["ok"]
                else "FAILED"
            )
        )
        for failure in check["failures"]:
            print(f"  - {failure}")
        if micro:
            print(format_micro(micro))
        if mode != "check":
            print(format_targets(found))
        elapsed = time.perf_counter() - started
        processes = (len(workers) if interleaved else len(jobs)) + len(memory_jobs)
        print(f"\n{processes} worker processes in {elapsed:.0f} s")
        report = {
            "mode": mode,
            "command": " ".join([os.path.relpath(__file__, ROOT)] + list(argv or sys.argv[1:])),
            "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "seconds": elapsed,
            "machine": machine,
            "worker_env": {
                k: v
                for k, v in env.items()
                if k in WORKER_ENV or k.startswith(("MXNET_", "OMP_", "KMP_"))
            },
            "settings": {
                "cells": [list(c) for c in cells],
                "samples_per_epoch": samples,
                "adam_samples_per_epoch": (
                    adam_samples
                    if isinstance(adam_samples, int)
                    else {str(k): v for k, v in adam_samples.items()}
                ),
                "design": "interleaved" if interleaved else "separate",
                "order": args.order if interleaved else None,
                "timed_epochs": timed,
                "warmup_epochs": 1,
                "repeat": repeat,
                "memory_pass": bool(memory_jobs),
                "memory_timed_epochs": config["memory_timed_epochs"] if memory_jobs else None,
                "parallel_workers": config["parallel"],
                "wait_quiet": args.wait_quiet,
                "nice": args.nice,
                "max_load": args.max_load,
                "retries": args.retries,
                "worker_timeout": args.worker_timeout,
                "workers": "fresh interpreters" if args.spawn else "forked from a fork server",
            },
            "mxnet": next((j.result["mxnet"] for j in jobs if j.result), None),
            "results": rows,
            "correctness": check,
            "targets": found if mode != "check" else [],
            "micro": micro,
        }
        path = args.json or DEFAULT_JSON
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as f:
            json.dump(report, f, indent=1)
        print(f"results written to {path}")
        if args.markdown:
            with open(args.markdown, "w") as f:
                f.write(format_markdown(report))
            print(f"Markdown table written to {args.markdown}")
        return 0 if check["ok"] else 1
    finally:
        if args.keep:
            print(f"workers' folders kept in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
