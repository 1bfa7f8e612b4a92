"""Worker processes, seen from the parent: start them, watch them, collect their results.

Workers fork from a fork server that has only imported MXNet (once: 3 s), import mxoid
from their ``PYTHONPATH`` and run :func:`harness.worker.run_worker`. Imports no MXNet.
"""

import json
import multiprocessing
import os
import subprocess
import sys
import time
from typing import Callable, Dict, List, Optional

import numpy as np

from harness.env import OtherLoad


class Launcher:
    """Starts workers forked from a fork server that imported MXNet in ``env``."""

    def __init__(self, env: Dict[str, str]) -> None:
        os.environ.update(env)  # the fork server's: thread settings before MXNet
        self.paths = env["PYTHONPATH"].split(os.pathsep)
        self.context = multiprocessing.get_context("forkserver")
        self.context.set_forkserver_preload(["mxnet"])
        warm_up = self.context.Process(target=os.getpid)  # MXNet's import in no worker's time
        warm_up.start()
        warm_up.join()

    def start(self, spec_path: str):
        process = self.context.Process(target=_forked_worker, args=(spec_path, self.paths))
        process.start()
        return process


def _forked_worker(spec_path: str, paths: List[str]) -> None:
    sys.path[:0] = paths  # the worker was given the parent's sys.path
    folder = os.path.dirname(spec_path)
    output = os.open(os.path.join(folder, "output.txt"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(output, 1)
    os.dup2(output, 2)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    os.chdir(folder)
    from harness import worker

    worker.run_worker(spec_path)


def _exit_code(process) -> Optional[int]:
    """The exit status of a finished worker, None while it runs (Popen or Process)."""
    if isinstance(process, subprocess.Popen):
        return process.poll()
    return None if process.is_alive() else process.exitcode


class Job:
    """One worker process: its spec (:mod:`harness.worker`), cell, folder, attempts (a hung
    worker is killed and run once more, in a new folder) and result."""

    result_file = "result.json"

    def __init__(self, spec: dict, cell: tuple, root: str, name: str) -> None:
        self.spec, self.cell = spec, cell
        self.contender = spec.get("contender", "in turns")
        self.samples, self.epochs = spec["samples"], spec["epochs"]
        self.root = os.path.join(root, name)
        self.attempts: List[dict] = []
        self.workdir, self.process, self.started, self.wall = "", None, 0.0, 0.0
        self.load: Optional[OtherLoad] = None
        self.foreign_load: Optional[float] = None  # other processes' CPU meanwhile, cores
        self.result, self.error, self.killed = None, None, False  # a dict, a str when done

    def start(self, launcher) -> None:
        self.workdir = os.path.join(self.root, f"attempt{len(self.attempts)}")
        os.makedirs(self.workdir)
        spec_path = os.path.join(self.workdir, "spec.json")
        with open(spec_path, "w") as f:
            json.dump({**self.spec, "workdir": self.workdir}, f)
        self.load, self.started = OtherLoad(), time.perf_counter()
        self.process = launcher.start(spec_path)

    def finish(self, alone: bool, timeout: Optional[float] = None) -> None:
        """Collect the ended worker's result; ``alone``: no other worker ran meanwhile."""
        attempt = {"workdir": self.workdir, "wall": time.perf_counter() - self.started}
        attempt.update(result=None, error=None, foreign_load=None, timed_out=self.killed)
        self.killed = False
        code = _exit_code(self.process)
        path = os.path.join(self.workdir, self.result_file)
        if code != 0 or not os.path.exists(path):
            with open(os.path.join(self.workdir, "output.txt")) as f:
                tail = f.read()[-3000:]
            last = ([ln for ln in tail.splitlines() if ln.strip()] or ["no output"])[-1]
            if attempt["timed_out"]:
                last = f"killed after --worker-timeout {timeout:g} s (hung)"
            attempt["error"] = f"worker exited with status {code}: {last}\n{tail}"
        else:
            with open(path) as f:
                attempt["result"] = json.load(f)
            if alone:
                attempt["foreign_load"] = self.load.cores(attempt["result"]["cpu_seconds"])
        self.attempts.append(attempt)
        self.workdir, self.wall = attempt["workdir"], attempt["wall"]
        self.result, self.error = attempt["result"], attempt["error"]
        self.foreign_load = attempt["foreign_load"]


class InterleavedJob(Job):
    """Every contender of a cell in one worker, an epoch each in turn; :meth:`members`
    gives them back as one finished :class:`Job` each, read as separate workers are."""

    result_file = "done.json"

    def members(self) -> List[Job]:
        jobs = []
        for name in self.spec["contenders"]:
            spec = {k: v for k, v in self.spec.items() if k != "contenders"}
            job = Job({**spec, "contender": name}, self.cell, os.path.dirname(self.root), name)
            job.workdir, job.wall = os.path.join(self.workdir, name), self.wall
            job.attempts, job.foreign_load = self.attempts, self.foreign_load
            path = os.path.join(job.workdir, "result.json")
            if self.error is not None:
                job.error = self.error
            elif not os.path.exists(path):
                job.error = f"{name}: no result written by the interleaved worker"
            else:
                with open(path) as f:
                    job.result = json.load(f)
                if job.result.get("error"):
                    job.error, job.result = job.result["error"], None
            jobs.append(job)
        return jobs


def run_jobs(
    jobs: List[Job],
    parallel: int,
    launcher,
    quiet: bool = False,
    worker_timeout: Optional[float] = None,
    describe: Callable[[tuple], str] = str,
) -> None:
    """Run the jobs, ``parallel`` at a time; a worker still running after
    ``worker_timeout`` seconds is killed (a hung process) and run once more."""
    pending, running, done = list(jobs), [], 0
    try:
        while pending or running:
            while pending and len(running) < parallel:
                job = pending.pop(0)
                job.start(launcher)
                running.append(job)
            for job in running:
                if worker_timeout and not job.killed:
                    if time.perf_counter() - job.started > worker_timeout:
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
                again = job.attempts[-1]["timed_out"] and len(job.attempts) < 2
                if not quiet:
                    what = f"{describe(job.cell):<22} {job.contender:<20} {_summary(job)}"
                    print(f"[{done + 1:>2}/{len(jobs)}] {what}{' -> again' * again}", flush=True)
                if again:
                    pending.insert(0, job)
                else:
                    done += 1
    finally:
        for job in running:  # interrupted: leave no worker behind
            job.process.terminate()


def _summary(job: Job) -> str:
    attempt = job.attempts[-1]
    if attempt["error"]:
        return "FAILED"
    if attempt["result"].get("interleaved"):
        return f"{attempt['result']['rounds']} rounds ({attempt['wall']:.1f} s)"
    rates = job.samples / np.diff(attempt["result"]["epoch_stamps"])[1:]
    load = attempt["foreign_load"]
    load = "" if load is None else f", other load {load:.2f} cores"
    return f"{float(np.median(rates)):>9,.0f} samples/s ({attempt['wall']:.1f} s{load})"
