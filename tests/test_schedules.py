"""mxoid.schedules equal their formulas at every step; runs with a schedule resume exactly."""

import math

import mxnet as mx
import numpy as np
import pytest
from checkpointing import assert_identical
from conftest import classification_data, initial_params, mlp

from mxoid import Checkpoint, Extension, FinishAfter, LearningRateSchedule, MainLoop
from mxoid.schedules import InverseSqrt, Noam, Warmup, WarmupCosine


class Status:
    def __init__(self, updates_done):
        self.updates_done = updates_done


def test_each_schedule_equals_its_formula_at_every_step():
    for t in range(1, 301):
        status = Status(t - 1)
        assert Noam(64, 50, factor=2)(status) == pytest.approx(
            2 * 64**-0.5 * min(t**-0.5, t * 50**-1.5), rel=1e-12
        )
        expected = 0.5 * t / 40 if t <= 40 else 0.5 * math.sqrt(40 / t)
        assert InverseSqrt(40, base_lr=0.5)(status) == pytest.approx(expected, rel=1e-12)
        if t <= 30:
            cosine = 0.1 * t / 30
        elif t >= 200:
            cosine = 0.01
        else:
            cosine = 0.01 + 0.09 * (1 + math.cos(math.pi * (t - 30) / 170)) / 2
        assert WarmupCosine(30, 200, final=0.01, base_lr=0.1)(status) == pytest.approx(cosine)
        factor = mx.lr_scheduler.FactorScheduler(step=7, factor=0.5, base_lr=0.2)
        assert Warmup(factor, 25)(status) == pytest.approx(
            max(0.2 * 0.5 ** ((t - 1) // 7), 1e-8) * min(1, t / 25)
        )
        assert Warmup(lambda s: 0.3, 10)(status) == pytest.approx(0.3 * min(1, t / 10))


class RateEveryStep(Extension):
    """The optimizer's rate at every batch, as the step used it."""

    def __init__(self):
        super().__init__()
        self.rates = {}

    def before_update(self):
        self.rates[self.main_loop.status.updates_done + 1] = self.main_loop.optimizer.learning_rate

    def state_dict(self):
        return {"rates": [[k, v] for k, v in self.rates.items()]}

    def load_state_dict(self, state):
        self.rates = {k: v for k, v in state["rates"]}


SCHEDULES = {
    "noam": lambda: Noam(16, 10),
    "inverse_sqrt": lambda: InverseSqrt(8, base_lr=0.2),
    "warmup_cosine": lambda: WarmupCosine(6, 40, final=0.001, base_lr=0.3),
    "warmup_factor": lambda: Warmup(
        mx.lr_scheduler.FactorScheduler(step=5, factor=0.7, base_lr=0.2), 4
    ),
    "factor": lambda: mx.lr_scheduler.FactorScheduler(
        step=5, factor=0.7, base_lr=0.2, warmup_steps=4, warmup_begin_lr=0.01
    ),
    "multifactor": lambda: mx.lr_scheduler.MultiFactorScheduler(
        step=[7, 13, 22], factor=0.5, base_lr=0.2, warmup_steps=3
    ),
    "cosine": lambda: mx.lr_scheduler.CosineScheduler(
        max_update=30, base_lr=0.2, final_lr=0.01, warmup_steps=5, warmup_mode="constant"
    ),
}


def run(directory, schedule, stop, resume=False):
    X, y = classification_data(n=120)
    net = mlp()
    rates = RateEveryStep()
    np.random.seed(5)  # the iterator's first shuffle
    loop = MainLoop(
        net,
        mx.io.NDArrayIter(X, y, batch_size=20, shuffle=True, label_name="softmax_label"),
        optimizer_params={"learning_rate": 0.1, "momentum": 0.9},
        arg_params=initial_params(net, (20, 10)),
        extensions=[
            stop,
            LearningRateSchedule(schedule),
            rates,
            Checkpoint(str(directory), every_n_batches=5),
        ],
        resume_from=str(directory) if resume else None,
    )
    return loop.run(), rates


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_stopped_mid_epoch_and_resumed_equals_uninterrupted(tmp_path, name):
    full, full_rates = run(tmp_path / "full", SCHEDULES[name](), FinishAfter(after_n_epochs=6))
    run(tmp_path / "cut", SCHEDULES[name](), FinishAfter(after_n_batches=15))
    resumed, resumed_rates = run(
        tmp_path / "cut", SCHEDULES[name](), FinishAfter(after_n_epochs=6), resume=True
    )
    assert len(full_rates.rates) == 36
    assert full_rates.rates == resumed_rates.rates
    assert len(set(full_rates.rates.values())) > 3
    full_lr = {i: r["learning_rate"] for i, r in full.log.items() if "learning_rate" in r}
    resumed_lr = {i: r["learning_rate"] for i, r in resumed.log.items() if "learning_rate" in r}
    assert full_lr == resumed_lr
    params = [{k: v.asnumpy() for k, v in loop.get_params()[0].items()} for loop in (full, resumed)]
    assert_identical(*params)


def test_an_advanced_lrscheduler_object_continues_from_the_checkpoint(tmp_path):
    """The same object given again, already past the checkpoint: its saved state wins."""
    scheduler = SCHEDULES["multifactor"]()
    full, full_rates = run(tmp_path / "full", scheduler, FinishAfter(after_n_epochs=6))
    run(tmp_path / "cut", SCHEDULES["multifactor"](), FinishAfter(after_n_batches=15))
    _, resumed_rates = run(tmp_path / "cut", scheduler, FinishAfter(after_n_epochs=6), resume=True)
    assert full_rates.rates == resumed_rates.rates
