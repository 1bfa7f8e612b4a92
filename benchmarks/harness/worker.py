"""What runs in a worker process: a cell's contenders in turns, or one contender alone.

The spec (``spec.json``) names ``suite``, a module with ``CONTENDERS`` (name ->
``f(spec, iterator, init, clock)`` returning the final parameters) and ``prepare(spec)``
(data, labels, initial parameters); each contender writes ``result.json``, ``params.npz``.
"""

import importlib
import json
import os
import resource

import mxnet as mx
import numpy as np

from harness import turns, workload


def run_worker(spec_path: str) -> None:
    with open(spec_path) as f:
        spec = json.load(f)
    suite = importlib.import_module(spec["suite"])
    (train_in_turns if "contenders" in spec else train_alone)(spec, suite)


def _write(folder: str, result: dict, params) -> None:
    with open(os.path.join(folder, "result.json"), "w") as f:
        json.dump(result, f)
    if params is not None:
        np.savez(os.path.join(folder, "params.npz"), **params)


def train_in_turns(spec: dict, suite) -> None:
    """Every contender in a thread of its own, an epoch each per round (order drawn with
    the process's index as seed); then ``done.json`` in the worker's folder."""
    X, y, init = suite.prepare(spec)
    data, label = mx.nd.array(X), mx.nd.array(y)  # shared, read only
    del X, y
    functions = {name: suite.CONTENDERS[name] for name in spec["contenders"]}
    players = {n: turns.Player(n, spec, data, label, init, f) for n, f in functions.items()}
    turns.play_rounds(players, spec["epochs"], seed=spec.get("repeat", 0))
    for player in players.values():
        _write(player.workdir, player.result(), player.params)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    done = {"interleaved": True, "contenders": list(players), "rounds": spec["epochs"] - 1}
    done["cpu_seconds"] = usage.ru_utime + usage.ru_stime
    with open(os.path.join(spec["workdir"], "done.json"), "w") as f:
        json.dump(done, f)


def train_alone(spec: dict, suite) -> None:
    """One contender: its epoch stamps, and its peak memory during training."""
    spec["notes"] = []
    X, y, init = suite.prepare(spec)
    options = dict(batch_size=spec["batch_size"], shuffle=False, label_name="softmax_label")
    iterator = mx.io.NDArrayIter(X, y, **options)
    del X, y
    rss_before = workload.rss_kib()
    training_peak = workload.reset_peak_rss()
    if not training_peak:
        spec["notes"].append("peak memory: the whole process's (clear_refs refused)")
    clock = workload.EpochClock()
    clock.tick()
    params = suite.CONTENDERS[spec["contender"]](spec, iterator, init, clock)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    result = {"epoch_stamps": clock.stamps, "epoch_cpu_stamps": clock.cpu_stamps}
    result["epoch_thread_stamps"] = clock.thread_stamps
    peak = (workload.peak_rss_kib() if training_peak else None) or usage.ru_maxrss
    result.update(peak_rss_kib=peak, rss_before_training_kib=rss_before, notes=spec["notes"])
    result["finite"] = bool(all(np.isfinite(v).all() for v in params.values()))
    result.update(cpu_seconds=usage.ru_utime + usage.ru_stime, mxnet=mx.__version__)
    _write(spec["workdir"], result, params)
