"""Gradient accumulation (accumulate_batches=k) and the hooks around the optimizer step.

The reference is the same training without accumulation and k times the batch: on a
network without BatchNorm the two compute the same sums in another order, so the
parameters agree to float precision. (Dropout is left out too: its masks follow the
batch layout.)
"""

import mxnet as mx
import numpy as np
import pytest
from conftest import TWO_CPUS, classification_data, initial_params, mlp
from networks import digits_images, dropout_lenet

from mxoid import (
    Checkpoint,
    Extension,
    FinishAfter,
    LearningRateSchedule,
    MainLoop,
    TrainingMonitoring,
)

DEVICES = {"one": [mx.cpu()], "two": TWO_CPUS}
MOMENTUM = {"learning_rate": 0.1, "momentum": 0.9, "wd": 1e-3}


def conv_net():
    """LeNet without Dropout: convolutions, pooling and two dense layers."""
    return dropout_lenet(p=0.0)


def digits_loop(batch_size, accumulate, devices, update_on_kvstore, extensions=(), **kwargs):
    X, y = digits_images(192)
    np.random.seed(3)
    train = mx.io.NDArrayIter(X, y, batch_size=batch_size, label_name="softmax_label")
    net = conv_net()
    return MainLoop(
        net,
        train,
        contexts=DEVICES[devices],
        arg_params=initial_params(net, (batch_size, 1, 8, 8)),
        optimizer="sgd",
        optimizer_params=dict(MOMENTUM),
        update_on_kvstore=update_on_kvstore,
        accumulate_batches=accumulate,
        extensions=[FinishAfter(after_n_epochs=3), *extensions],
        **kwargs,
    )


def params_of(loop):
    return {k: v.asnumpy() for k, v in loop.get_params()[0].items()}


@pytest.mark.parametrize("update_on_kvstore", [False, True])
@pytest.mark.parametrize("devices", ["one", "two"])
def test_two_batches_of_16_accumulated_train_as_one_batch_of_32(devices, update_on_kvstore):
    whole = digits_loop(32, 1, devices, update_on_kvstore).run()
    accumulated = digits_loop(16, 2, devices, update_on_kvstore).run()
    assert accumulated.status.iterations_done == 2 * whole.status.iterations_done == 36
    assert accumulated.status.updates_done == whole.status.updates_done == 18
    assert accumulated.optimizer.rescale_grad == pytest.approx(1 / 32)
    ours, reference = params_of(accumulated), params_of(whole)
    start = initial_params(conv_net(), (32, 1, 8, 8))
    for name in reference:
        assert not np.allclose(reference[name], start[name].asnumpy()), name
        np.testing.assert_allclose(ours[name], reference[name], rtol=1e-5, atol=1e-6, err_msg=name)


def test_accumulation_is_not_a_larger_learning_rate():
    """What the attempts of apache/mxnet #16969 got wrong: without the rescaling, the sum of
    two batches is a doubled step. Here a single step of 2 x 16 equals one step of 32."""
    one_step = [FinishAfter(after_n_batches=2)]
    accumulated = digits_loop(16, 2, "one", False, extensions=one_step).run()
    assert accumulated.status.updates_done == 1
    whole = digits_loop(32, 1, "one", False, extensions=[FinishAfter(after_n_batches=1)]).run()
    for name, value in params_of(whole).items():
        np.testing.assert_allclose(params_of(accumulated)[name], value, rtol=1e-5, atol=1e-7)


def test_learning_rate_schedules_count_optimizer_steps():
    """Both MXNet's own scheduler (inside the optimizer) and LearningRateSchedule count steps."""

    def schedule():
        return mx.lr_scheduler.FactorScheduler(step=4, factor=0.5, base_lr=0.1)

    for accumulate, batch in ((1, 32), (2, 16)):
        rates = LearningRateSchedule(schedule())
        loop = digits_loop(batch, accumulate, "one", False, extensions=[rates]).run()
        recorded = [(i, r["learning_rate"]) for i, r in loop.log.items() if "learning_rate" in r]
        steps = [(i // accumulate, rate) for i, rate in recorded]
        if accumulate == 1:
            reference, reference_params = steps, params_of(loop)
    assert steps == reference and len(steps) == 5  # 0.1, then halved after 4, 8, 12, 16 steps
    for name, value in reference_params.items():
        np.testing.assert_allclose(params_of(loop)[name], value, rtol=1e-5, atol=1e-6)


def test_an_incomplete_group_when_training_ends_is_not_applied_and_said_so():
    loop = digits_loop(16, 4, "one", False, extensions=[FinishAfter(after_n_batches=7)])
    with pytest.warns(UserWarning, match=r"3 batch\(es\) into a group of accumulate_batches=4"):
        loop.run()
    assert loop.status.iterations_done == 7 and loop.status.updates_done == 1


def test_a_group_spans_the_end_of_an_epoch():
    """12 batches per epoch, groups of 5: the third group takes batches 11 and 12 of the first
    epoch and 1 to 3 of the second; every step sums exactly 5 batches."""
    steps = []

    class Steps(Extension):
        def after_update(self):
            status = self.main_loop.status
            steps.append((status.epochs_done, status.iterations_done + 1, status.updates_done))

    with pytest.warns(UserWarning, match="1 batch"):  # 36 = 7 x 5 + 1
        loop = digits_loop(16, 5, "one", False, extensions=[Steps()]).run()
    assert steps[:3] == [(0, 5, 1), (0, 10, 2), (1, 15, 3)]
    assert loop.status.updates_done == 36 // 5


@pytest.mark.parametrize("devices", ["one", "two"])
def test_a_checkpoint_in_the_middle_of_a_group_resumes_bit_identically(tmp_path, devices):
    def make(directory, stop, resume=False):
        X, y = classification_data(n=200)
        np.random.seed(5)
        net = mlp()
        return MainLoop(
            net,
            mx.io.NDArrayIter(X, y, batch_size=10, shuffle=True, label_name="softmax_label"),
            contexts=DEVICES[devices],
            optimizer="adam",
            optimizer_params={"learning_rate": 0.01},
            arg_params=initial_params(net, (10, 10)),
            accumulate_batches=4,
            extensions=[
                stop,
                Checkpoint(str(directory), every_n_batches=7),
                TrainingMonitoring(["acc", "ce"]),
            ],
            resume_from=str(directory) if resume else None,
        )

    full = make(tmp_path / "full", FinishAfter(after_n_epochs=2)).run()
    with pytest.warns(UserWarning, match="into a group"):
        make(tmp_path / "cut", FinishAfter(after_n_batches=14)).run()  # 2 batches into a group
    resumed = make(tmp_path / "cut", FinishAfter(after_n_epochs=2), resume=True).run()
    assert resumed.status.updates_done == full.status.updates_done == 10
    for name, value in params_of(full).items():
        np.testing.assert_array_equal(params_of(resumed)[name], value, err_msg=name)
    assert resumed.log.last("train_accuracy") == full.log.last("train_accuracy")


def test_resuming_with_another_accumulate_batches_is_refused(tmp_path):
    digits_loop(16, 2, "one", False, extensions=[Checkpoint(tmp_path, every_n_epochs=1)]).run()
    with pytest.raises(ValueError, match="accumulate_batches"):
        digits_loop(16, 4, "one", False, resume_from=tmp_path)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_accumulate_batches_must_be_a_positive_int(bad):
    with pytest.raises(ValueError, match="accumulate_batches must be an int >= 1"):
        digits_loop(16, bad, "one", False)


# ------------------------------------------------------- before_update / after_update
class Around(Extension):
    """Notes the counters at both hooks, and doubles the gradients before each step."""

    def __init__(self, double=False):
        super().__init__()
        self.notes, self.double = [], double

    def before_update(self):
        status = self.main_loop.status
        self.notes.append(("before", status.iterations_done, status.updates_done))
        if self.double:
            for grads in self.main_loop.manager.grad_arrays:
                for grad in grads:
                    grad *= 2

    def after_update(self):
        status = self.main_loop.status
        self.notes.append(("after", status.iterations_done, status.updates_done))


@pytest.mark.parametrize("update_on_kvstore", [False, True])
@pytest.mark.parametrize("devices", ["one", "two"])
def test_before_update_sees_and_changes_the_gradients_of_the_step(devices, update_on_kvstore):
    """Doubling every gradient with plain SGD is doubling the learning rate."""

    def make(extensions, rate):
        X, y = classification_data(n=120)
        net = mlp()
        return MainLoop(
            net,
            mx.io.NDArrayIter(X, y, batch_size=20, label_name="softmax_label"),
            contexts=DEVICES[devices],
            optimizer_params={"learning_rate": rate},
            arg_params=initial_params(net, (20, 10)),
            update_on_kvstore=update_on_kvstore,
            accumulate_batches=2,
            extensions=[FinishAfter(after_n_epochs=2), *extensions],
        ).run()

    around = Around(double=True)
    doubled = make([around], 0.1)
    reference = make([], 0.2)
    for name, value in params_of(reference).items():
        np.testing.assert_allclose(params_of(doubled)[name], value, rtol=1e-5, atol=1e-6)
    # Every second batch, before the counters move: batches 2, 4, ... and steps 1, 2, ...
    assert around.notes[:4] == [
        ("before", 1, 0),
        ("after", 1, 1),
        ("before", 3, 1),
        ("after", 3, 2),
    ]
    assert len(around.notes) == 2 * 6


def test_update_hooks_take_firing_conditions_and_report_in_the_profile():
    fired = []

    class Every(Extension):
        def do(self, which_callback, *args):
            fired.append((which_callback, self.main_loop.status.updates_done))

    X, y = classification_data(n=100)
    net = mlp()
    loop = MainLoop(
        net,
        mx.io.NDArrayIter(X, y, batch_size=20, label_name="softmax_label"),
        arg_params=initial_params(net, (20, 10)),
        extensions=[Every(after_update=True), FinishAfter(after_n_batches=3)],
    ).run()
    assert fired == [("after_update", 1), ("after_update", 2), ("after_update", 3)]
    assert any(entry[1] == "after_update" for entry in loop.profile())
