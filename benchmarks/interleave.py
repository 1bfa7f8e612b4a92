"""Contenders of one cell trained side by side in one process, an epoch each in turn.

A shared machine changes speed from second to second, and a process can sit at
a level of its own for all of its life: contenders timed in processes of their
own, one after the other, carry those differences into their ratios (on the
2-core VM these benchmarks run on, 30-50% between workers of one contender).
Here every contender of a cell trains in one process, each in a thread of its
own, and they take turns: each trains one epoch while the others wait, in an
order drawn anew every round. A ratio between two contenders is then taken
round by round, between epochs run a fraction of a second apart in the same
process.

The turns are handed over at the epoch clock (:class:`TurnClock`): every
contender already stamps the end of each epoch after ``mx.nd.waitall()``, so
the engine is idle when the next one starts, and no contender's code changes.
Each contender keeps its own executors, optimizer, iterator and thread; they
share the process, MXNet's engine and the data arrays (read only).

Run by ``run.py`` (``python interleave.py SPEC.json`` by hand); writes, per
contender, ``<contender>/result.json`` and ``params.npz`` as a worker of
``contenders.py`` does, with the epoch times of every round.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import threading
import time
import traceback
from typing import Dict, List, Optional

import contenders  # puts the thread settings in the environment before MXNet
import mxnet as mx
import numpy as np

__all__ = ["ORDERS", "Player", "TurnClock", "rotation", "run_interleaved_worker", "shuffled"]

TURN_TIMEOUT = 600.0
"""Seconds a turn may last before the worker gives up on that contender (a hang)."""


class TurnClock(contenders.EpochClock):
    """The epoch clock of a contender that trains in turns.

    After stamping the end of an epoch (on the contender's thread, after
    ``mx.nd.waitall()``), it hands the turn back and waits for the next one.
    """

    def __init__(self) -> None:
        super().__init__()
        self.turn = threading.Semaphore(0)
        self.yielded = threading.Semaphore(0)

    def tick(self, *_ignored) -> None:
        super().tick()
        self.yielded.release()
        self.turn.acquire()


class Player:
    """One contender in its own thread, trained an epoch per turn."""

    def __init__(self, name: str, spec: dict, data, label, init, function=None) -> None:
        self.name = name
        self.function = function or contenders.CONTENDERS[name][0]
        self.workdir = os.path.join(spec["workdir"], name)
        os.makedirs(self.workdir, exist_ok=True)
        self.spec = {**spec, "contender": name, "workdir": self.workdir, "notes": []}
        self.iterator = mx.io.NDArrayIter(
            data, label, batch_size=spec["batch_size"], shuffle=False, label_name="softmax_label"
        )
        self.init = init
        self.clock = TurnClock()
        self.params: Optional[Dict[str, np.ndarray]] = None
        self.error: Optional[str] = None
        self.epoch_seconds: List[float] = []
        self.epoch_cpu_seconds: List[float] = []
        self.epoch_host_seconds: List[float] = []
        self.thread = threading.Thread(target=self._train, name=name, daemon=True)

    def _train(self) -> None:
        self.clock.turn.acquire()  # the first turn: build, then the warm-up epoch
        try:
            self.params = self.function(self.spec, self.iterator, self.init, self.clock)
        except BaseException:
            self.error = traceback.format_exc()
        finally:
            self.clock.yielded.release()

    def play(self, timeout: float = TURN_TIMEOUT) -> bool:
        """Let the contender train one epoch; return False once it has failed or hung."""
        if self.error is not None:
            return False
        mx.nd.waitall()
        clock = self.clock
        stamps, wall, cpu = len(clock.stamps), time.perf_counter(), time.process_time()
        clock.turn.release()
        if not clock.yielded.acquire(timeout=timeout):
            self.error = f"{self.name}: no epoch end within {timeout:g} s (hung)"
            return False
        if self.error is not None or len(clock.stamps) == stamps:
            self.error = self.error or f"{self.name}: returned before its last epoch"
            return False
        self.epoch_seconds.append(clock.stamps[-1] - wall)
        self.epoch_cpu_seconds.append(clock.cpu_stamps[-1] - cpu)
        # The thread ran only in its turns: its CPU time between two epoch ends is
        # that of this epoch (the first one's holds the binding, and is not timed).
        previous = clock.thread_stamps[-2] if len(clock.thread_stamps) > 1 else 0.0
        self.epoch_host_seconds.append(clock.thread_stamps[-1] - previous)
        return True

    def finish(self, timeout: float = TURN_TIMEOUT) -> None:
        """Let the contender end its training (after its last epoch) and return."""
        if self.error is None:
            self.clock.turn.release()
            self.thread.join(timeout)
            if self.thread.is_alive():
                self.error = f"{self.name}: did not return after its last epoch (hung)"
            elif self.params is None and self.error is None:
                self.error = f"{self.name}: returned no parameters"

    def result(self) -> dict:
        return {
            "interleaved": True,
            # round 0 (binding and the warm-up epoch) is not timed
            "epoch_seconds": self.epoch_seconds[1:],
            "epoch_cpu_seconds": self.epoch_cpu_seconds[1:],
            "epoch_host_seconds": self.epoch_host_seconds[1:],
            "warmup_seconds": self.epoch_seconds[0] if self.epoch_seconds else None,
            "peak_rss_kib": None,
            "rss_before_training_kib": None,
            "finite": bool(all(np.isfinite(v).all() for v in (self.params or {}).values())),
            "cpu_seconds": float(sum(self.epoch_cpu_seconds)),
            "notes": self.spec["notes"],
            "mxnet": mx.__version__,
        }


def rotation(names: List[str], round_index: int) -> List[str]:
    """The order of a round: the contenders rotated by the round's index."""
    shift = round_index % len(names)
    return names[shift:] + names[:shift]


def shuffled(names: List[str], round_index: int, seed: int = 0) -> List[str]:
    """The order of a round: the contenders in an order drawn for it (fixed seed).

    Over the rounds every contender follows every other one about as often, so
    whatever one contender leaves behind for the next (in the engine, the
    allocator, the caches) falls on all alike; a rotation has each contender
    follow the same one in almost every round. The timed rounds come in pairs
    (1 and 2, 3 and 4, ...; round 0, the warm-up, alone), the second running the
    first's order reversed: over each pair every contender takes each position
    alike (with two contenders, first in one round and second in the other), and
    one that follows another in one round precedes it in the next. Drawn
    independently, two contenders' positions were unbalanced in a process of 8
    rounds (one first in 5 of them), and two instances of the hand loop measured
    up to 1.04 of each other.
    """
    pair = (round_index + 1) // 2
    rng = np.random.RandomState([seed, pair])
    order = [names[i] for i in rng.permutation(len(names))]
    return order[::-1] if round_index > 0 and round_index % 2 == 0 else order


def rotated(names: List[str], round_index: int, seed: int = 0) -> List[str]:
    """:func:`rotation`, with :func:`shuffled`'s arguments (``--order rotate``)."""
    return rotation(names, round_index)


ORDERS = {"shuffle": shuffled, "rotate": rotated}
"""``run.py --order``: how the contenders' order is drawn for each round."""


def run_interleaved_worker(spec_path: str) -> None:
    """Train the contenders of ``spec_path`` in turns; write each one's result and parameters.

    The spec holds the cell (``model``, ``batch_size``, ``contexts``,
    ``optimizer``), ``samples`` per epoch, ``epochs`` (the warm-up round and
    the timed ones), ``contenders`` and ``workdir``. A contender that fails or
    hangs is left out of the following rounds and reported; the others go on.
    """
    with open(spec_path) as f:
        spec = json.load(f)
    X, y = contenders.make_data(spec["model"], spec["samples"])
    data, label = mx.nd.array(X), mx.nd.array(y)  # shared, read only
    del X, y
    init = contenders.initial_params(spec["model"])
    players = {name: Player(name, spec, data, label, init) for name in spec["contenders"]}
    for player in players.values():
        player.thread.start()
    names = list(players)
    order = ORDERS[spec.get("order", "shuffle")]
    for round_index in range(spec["epochs"]):
        for name in order(names, round_index, spec.get("repeat", 0)):
            player = players[name]
            if not player.play():
                print(f"{name} failed in round {round_index}:\n{player.error}", file=sys.stderr)
    for player in players.values():
        player.finish()
        result = player.result()
        result["error"] = player.error
        with open(os.path.join(player.workdir, "result.json"), "w") as f:
            json.dump(result, f)
        if player.params is not None:
            np.savez(os.path.join(player.workdir, "params.npz"), **player.params)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    with open(os.path.join(spec["workdir"], "done.json"), "w") as f:
        json.dump(
            {
                "interleaved": True,
                "contenders": names,
                "rounds": spec["epochs"] - 1,
                "cpu_seconds": usage.ru_utime + usage.ru_stime,
            },
            f,
        )


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: interleave.py SPEC.json (run.py starts the workers)")
    run_interleaved_worker(sys.argv[1])
