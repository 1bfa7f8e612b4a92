"""LearningRateSchedule: the rate it sets is the one the updates use, on both update paths."""

import mxnet as mx
import numpy as np
import pytest
from conftest import TWO_CPUS
from scripted import small_loop

from mxoid import FinishAfter, LearningRateSchedule

UPDATE_PATHS = [
    pytest.param([mx.cpu()], "local", None, id="one-device-local-updater"),
    pytest.param([mx.cpu()], "local", True, id="one-device-update-on-kvstore"),
    pytest.param(TWO_CPUS, "local", False, id="two-devices-local-updater"),
    pytest.param(TWO_CPUS, "local", True, id="two-devices-update-on-kvstore"),
]


def train(contexts, kvstore, update_on_kvstore, batches, extensions=(), **optimizer_params):
    loop = small_loop(
        list(extensions) + [FinishAfter(after_n_batches=batches)],
        contexts=contexts,
        kvstore=kvstore,
        update_on_kvstore=update_on_kvstore,
        optimizer_params=optimizer_params,
    ).run()
    return loop, {k: v.asnumpy() for k, v in loop.get_params()[0].items()}


def assert_same_params(a, b):
    for name in a:
        np.testing.assert_allclose(a[name], b[name], rtol=1e-6, atol=1e-7, err_msg=name)


@pytest.mark.parametrize("contexts, kvstore, update_on_kvstore", UPDATE_PATHS)
def test_the_rate_set_is_the_rate_the_update_uses(contexts, kvstore, update_on_kvstore):
    # Rate 0.5 for the first batch, 0 for the second (no momentum, no weight decay): the
    # parameters must equal those after one batch at rate 0.5, and differ from rate 0.1.
    schedule = LearningRateSchedule(lambda status: 0.5 if status.iterations_done == 0 else 0.0)
    loop, scheduled = train(contexts, kvstore, update_on_kvstore, 2, [schedule], learning_rate=0.1)
    assert loop.update_on_kvstore is bool(update_on_kvstore)
    _, reference = train(contexts, kvstore, update_on_kvstore, 1, learning_rate=0.5)
    _, unscheduled = train(contexts, kvstore, update_on_kvstore, 1, learning_rate=0.1)
    assert_same_params(scheduled, reference)
    assert not np.allclose(scheduled["fc1_weight"], unscheduled["fc1_weight"], atol=1e-4)
    assert loop.log[0]["learning_rate"] == 0.5 and loop.log[1]["learning_rate"] == 0.0
    assert loop.optimizer.lr == 0.0


@pytest.mark.parametrize("contexts, kvstore, update_on_kvstore", UPDATE_PATHS)
def test_an_lr_scheduler_trains_as_the_optimizers_own(contexts, kvstore, update_on_kvstore):
    ours = LearningRateSchedule(mx.lr_scheduler.FactorScheduler(step=2, factor=0.5, base_lr=0.4))
    loop, scheduled = train(
        contexts, kvstore, update_on_kvstore, 6, [ours], learning_rate=0.4, momentum=0.9
    )
    theirs = mx.lr_scheduler.FactorScheduler(step=2, factor=0.5, base_lr=0.4)
    _, reference = train(
        contexts,
        kvstore,
        update_on_kvstore,
        6,
        learning_rate=0.4,
        momentum=0.9,
        lr_scheduler=theirs,
    )
    assert_same_params(scheduled, reference)
    # Updates 1-2 at 0.4, 3-4 at 0.2, 5-6 at 0.1: recorded only when the rate changes.
    rates = {i: row["learning_rate"] for i, row in loop.log.items() if "learning_rate" in row}
    assert rates == {0: 0.4, 2: 0.2, 4: 0.1}


def test_a_schedule_per_epoch_uses_the_status():
    schedule = LearningRateSchedule(lambda status: 0.1 * 0.5**status.epochs_done, every="epoch")
    loop = small_loop([schedule, FinishAfter(after_n_epochs=3)]).run()
    rates = {i: row["learning_rate"] for i, row in loop.log.items() if "learning_rate" in row}
    assert rates == {0: 0.1, 4: 0.05, 8: 0.025}
    assert loop.optimizer.lr == 0.025


def test_an_optimizer_with_its_own_scheduler_is_refused():
    loop = small_loop([LearningRateSchedule(lambda status: 0.1), FinishAfter(after_n_batches=1)])
    loop.optimizer.lr_scheduler = mx.lr_scheduler.FactorScheduler(step=2)
    with pytest.raises(ValueError, match="its own lr_scheduler"):
        loop.run()


def test_a_bad_rate_is_refused():
    loop = small_loop([LearningRateSchedule(lambda status: -0.1), FinishAfter(after_n_batches=1)])
    with pytest.raises(ValueError, match="learning rate -0.1 at iteration 0"):
        loop.run()
    with pytest.raises(ValueError, match="every"):
        LearningRateSchedule(lambda status: 0.1, every="step")
    with pytest.raises(TypeError, match="callable"):
        LearningRateSchedule(0.1)
