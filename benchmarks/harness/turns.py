"""Interleaved rounds: the order of each round, and contenders trained an epoch each in turn.

A shared machine changes speed from second to second: in turns, in one process, two
contenders' times of a round are a fraction of a second apart. A :class:`Player` trains
in a thread of its own, handing the turn over at its epoch clock (after ``waitall``).
"""

import os
import threading
import time
import traceback
from typing import Callable, Dict, List, Optional, Sequence

import mxnet as mx
import numpy as np

from harness.workload import EpochClock

TURN_TIMEOUT = 600.0
"""Seconds a turn may last before the contender is given up (a hang)."""


def rotation(names: Sequence[str], round_index: int, seed: int = 0) -> List[str]:
    """The order of a round: the names rotated by the round's index."""
    shift = round_index % len(names)
    return list(names[shift:]) + list(names[:shift])


def alternating(names: Sequence[str], round_index: int, seed: int = 0) -> List[str]:
    """The order of a round: the names as given in even rounds, reversed in odd ones."""
    return list(names) if round_index % 2 == 0 else list(names)[::-1]


def shuffled(names: Sequence[str], round_index: int, seed: int = 0) -> List[str]:
    """The order of a round: drawn for each pair of timed rounds, reversed in the second.

    Over the rounds each contender follows each other one about as often, so that what
    one leaves behind for the next (in the engine, the allocator, the caches) falls on
    all alike. Rounds 1 and 2, 3 and 4, ... (0, the warm-up, alone) run an order and
    its reverse: over each pair every contender takes each position alike. Drawn
    independently, two contenders' positions were unbalanced in a process of 8 rounds,
    and two instances of the hand loop measured up to 1.04 of each other.
    """
    rng = np.random.RandomState([seed, (round_index + 1) // 2])
    order = [names[i] for i in rng.permutation(len(names))]
    return order[::-1] if round_index > 0 and round_index % 2 == 0 else order


def interleave(measure: Callable[[str], object], names: Sequence[str], rounds: int, order=rotation):
    """``{name: [measure(name) of each round]}``, the names measured in ``order`` each round."""
    values: Dict[str, list] = {name: [] for name in names}
    for round_index in range(rounds):
        for name in order(list(names), round_index):
            values[name].append(measure(name))
    return values


class TurnClock(EpochClock):
    """The epoch clock of a contender in turns: after stamping an epoch's end (on the
    contender's thread) it hands the turn back and waits for the next one."""

    def __init__(self) -> None:
        super().__init__()
        self.turn, self.yielded = threading.Semaphore(0), threading.Semaphore(0)

    def tick(self, *_ignored) -> None:
        super().tick()
        self.yielded.release()
        self.turn.acquire()


class Player:
    """One contender in its own thread, trained an epoch per turn: ``function(spec,
    iterator, init, clock)`` (see :mod:`harness.worker`); ``data`` and ``label``
    (NDArrays, read only) are shared, each player reading them through its own iterator."""

    def __init__(self, name: str, spec: dict, data, label, init, function: Callable) -> None:
        self.name, self.function, self.init = name, function, init
        self.workdir = os.path.join(spec["workdir"], name)
        os.makedirs(self.workdir, exist_ok=True)
        self.spec = {**spec, "contender": name, "workdir": self.workdir, "notes": []}
        options = dict(batch_size=spec["batch_size"], shuffle=False, label_name="softmax_label")
        self.iterator, self.clock = mx.io.NDArrayIter(data, label, **options), TurnClock()
        self.params: Optional[Dict[str, np.ndarray]] = None
        self.error: Optional[str] = None
        self.epoch_seconds, self.epoch_cpu_seconds, self.epoch_host_seconds = [], [], []
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
        """Let the contender train one epoch; False once it has failed or hung."""
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
        # The thread runs only in its turns: its CPU time between two epoch ends is
        # this epoch's (the first one's holds the binding, and is not timed).
        previous = clock.thread_stamps[-2] if len(clock.thread_stamps) > 1 else 0.0
        self.epoch_host_seconds.append(clock.thread_stamps[-1] - previous)
        return True

    def finish(self, timeout: float = TURN_TIMEOUT) -> None:
        """Let the contender end its training after its last epoch, and return."""
        if self.error is None:
            self.clock.turn.release()
            self.thread.join(timeout)
            if self.thread.is_alive():
                self.error = f"{self.name}: did not return after its last epoch (hung)"
            elif self.params is None:
                self.error = f"{self.name}: returned no parameters"

    def result(self) -> dict:
        """Its timed rounds (round 0, binding and the warm-up, is not timed) and more."""
        params = (self.params or {}).values()
        result = {"interleaved": True, "epoch_seconds": self.epoch_seconds[1:]}
        result["epoch_cpu_seconds"] = self.epoch_cpu_seconds[1:]
        result["epoch_host_seconds"] = self.epoch_host_seconds[1:]
        result["warmup_seconds"] = self.epoch_seconds[0] if self.epoch_seconds else None
        result.update(peak_rss_kib=None, rss_before_training_kib=None, error=self.error)
        result["finite"] = bool(all(np.isfinite(v).all() for v in params))
        result["cpu_seconds"] = float(sum(self.epoch_cpu_seconds))
        return {**result, "notes": self.spec["notes"], "mxnet": mx.__version__}


def play_rounds(players: Dict[str, Player], rounds: int, seed: int = 0, order=shuffled) -> None:
    """Start the players, let each train an epoch per round in the round's order, finish
    them. One that fails or hangs is left out of the following rounds; the others go on."""
    for player in players.values():
        player.thread.start()
    for round_index in range(rounds):
        for name in order(list(players), round_index, seed):
            players[name].play()
    for player in players.values():
        player.finish()
