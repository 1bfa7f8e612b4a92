"""ExponentialMovingAverage, StochasticWeightAveraging: NumPy averages, resumption, Evaluate."""

import mxnet as mx
import numpy as np
import pytest
from checkpointing import assert_identical
from conftest import TWO_CPUS, classification_data, initial_params, mlp

from mxoid import (
    Checkpoint,
    Evaluate,
    ExponentialMovingAverage,
    Extension,
    FinishAfter,
    MainLoop,
    StochasticWeightAveraging,
)

ONE_CPU = [mx.cpu(0)]


class Trajectory(Extension):
    """The parameters after every optimizer step, and at every epoch end."""

    def __init__(self):
        super().__init__(priority=-1)
        self.steps, self.epochs = [], []

    def _read(self):
        return {k: v.asnumpy() for k, v in self.main_loop.get_params()[0].items()}

    def before_training(self):
        self.steps.append(self._read())

    def after_update(self):
        self.steps.append(self._read())

    def after_epoch(self):
        self.epochs.append(self._read())


def bn_net():
    data = mx.sym.Variable("data")
    hidden = mx.sym.FullyConnected(data, num_hidden=8, name="fc1")
    hidden = mx.sym.BatchNorm(hidden, name="bn1", fix_gamma=False)
    hidden = mx.sym.Activation(hidden, act_type="relu")
    return mx.sym.SoftmaxOutput(
        mx.sym.FullyConnected(hidden, num_hidden=3, name="fc2"), name="softmax"
    )


def loop_of(extensions, contexts, net=None, directory=None, resume=False, epochs=3, stop=None):
    X, y = classification_data(n=120)
    net = mlp() if net is None else net
    train = mx.io.NDArrayIter(X, y, batch_size=20, label_name="softmax_label")
    saving = [Checkpoint(str(directory), every_n_batches=4)] if directory else []
    return MainLoop(
        net,
        train,
        contexts=contexts,
        optimizer="sgd",
        optimizer_params={"learning_rate": 0.1, "momentum": 0.9},
        arg_params=initial_params(net, (20, 10)),
        extensions=[stop or FinishAfter(after_n_epochs=epochs), *saving, *extensions],
        resume_from=str(directory) if resume else None,
    )


def host(params):
    return {k: v.asnumpy() for k, v in params.items()}


@pytest.mark.parametrize("contexts", [ONE_CPU, TWO_CPUS], ids=["one", "two"])
def test_ema_equals_numpys_average_of_the_trajectory(contexts):
    trajectory, ema = Trajectory(), ExponentialMovingAverage(decay=0.9)
    loop_of([trajectory, ema], contexts).run()
    expected = dict(trajectory.steps[0])
    for step in trajectory.steps[1:]:
        expected = {k: 0.9 * expected[k] + 0.1 * step[k] for k in expected}
    averaged = host(ema.get_params()[0])
    for name in expected:
        np.testing.assert_allclose(averaged[name], expected[name], rtol=1e-5, atol=1e-6)
    assert not np.allclose(averaged["fc1_weight"], trajectory.steps[-1]["fc1_weight"])


def test_ema_every_n_batches_moves_after_those_steps_only():
    trajectory, ema = Trajectory(), ExponentialMovingAverage(decay=0.5, every_n_batches=4)
    loop_of([trajectory, ema], ONE_CPU, epochs=2).run()
    expected = dict(trajectory.steps[0])
    for number, step in enumerate(trajectory.steps[1:], start=1):
        if number % 4 == 0:
            expected = {k: 0.5 * expected[k] + 0.5 * step[k] for k in expected}
    for name, value in host(ema.get_params()[0]).items():
        np.testing.assert_allclose(value, expected[name], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("contexts", [ONE_CPU, TWO_CPUS], ids=["one", "two"])
def test_swa_equals_numpys_mean_of_the_epochs(contexts):
    trajectory = Trajectory()
    swa = StochasticWeightAveraging(start_epoch=2, every_n_epochs=2)
    loop_of([trajectory, swa], contexts, epochs=6).run()
    taken = [trajectory.epochs[e - 1] for e in (2, 4, 6)]
    for name, value in host(swa.get_params()[0]).items():
        np.testing.assert_allclose(
            value, np.mean([t[name] for t in taken], 0), rtol=1e-5, atol=1e-6
        )
    assert swa.count == 3


@pytest.mark.parametrize("contexts", [ONE_CPU, TWO_CPUS], ids=["one", "two"])
def test_swa_recomputes_batchnorm_statistics_for_the_averaged_weights(contexts):
    X, y = classification_data(n=120)
    bn_data = mx.io.NDArrayIter(X, y, batch_size=30, label_name="softmax_label")
    trajectory, swa = Trajectory(), StochasticWeightAveraging(start_epoch=1, data=bn_data)
    loop = loop_of([trajectory, swa], contexts, net=bn_net(), epochs=3).run()
    arg, aux = (host(p) for p in swa.get_params())
    for name, value in arg.items():
        expected = np.mean([t[name] for t in trajectory.epochs], 0)
        np.testing.assert_allclose(value, expected, rtol=1e-5, atol=1e-6)
    # By hand: the averaged first layer on each batch of 30, its mean and variance averaged.
    h = [X[i : i + 30] @ arg["fc1_weight"].T + arg["fc1_bias"] for i in range(0, 120, 30)]
    np.testing.assert_allclose(
        aux["bn1_moving_mean"], np.mean([b.mean(0) for b in h], 0), rtol=1e-4, atol=1e-5
    )
    np.testing.assert_allclose(
        aux["bn1_moving_var"], np.mean([b.var(0) for b in h], 0), rtol=1e-4, atol=1e-5
    )
    loop_aux = host(loop.get_params()[1])
    assert not np.allclose(loop_aux["bn1_moving_mean"], aux["bn1_moving_mean"])


def test_swa_refuses_a_batchnorm_network_without_data():
    with pytest.raises(ValueError, match="data="):
        loop_of([StochasticWeightAveraging(start_epoch=1)], ONE_CPU, net=bn_net())


@pytest.mark.parametrize("contexts", [ONE_CPU, TWO_CPUS], ids=["one", "two"])
def test_evaluate_with_the_ema_equals_a_by_hand_evaluation(contexts):
    X, y = classification_data(n=60, seed=3)
    valid = mx.io.NDArrayIter(X, y, batch_size=30, label_name="softmax_label")
    ema = ExponentialMovingAverage(decay=0.8)
    evaluate = Evaluate({"ema_valid": valid}, ["ce"], parameters=ema)
    loop = loop_of([ema, evaluate, Evaluate({"valid": valid}, ["ce"])], contexts).run()
    before = host(loop.get_params()[0])
    arg, _ = (host(p) for p in ema.get_params())
    hidden = np.maximum(X @ arg["fc1_weight"].T + arg["fc1_bias"], 0)
    logits = hidden @ arg["fc2_weight"].T + arg["fc2_bias"]
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    by_hand = -np.mean(np.log(p[np.arange(60), y.astype(int)]))
    assert loop.log.current_row["ema_valid_cross_entropy"] == pytest.approx(by_hand, rel=1e-5)
    assert loop.log.current_row["valid_cross_entropy"] != pytest.approx(by_hand, rel=1e-3)
    scored = loop.score(valid, ["ce"], parameters=ema)
    assert scored["valid_cross_entropy"] == pytest.approx(by_hand, rel=1e-5)
    assert_identical(before, host(loop.get_params()[0]))  # the parameters given back


@pytest.mark.parametrize("contexts", [ONE_CPU, TWO_CPUS], ids=["one", "two"])
def test_stopped_and_resumed_equals_uninterrupted_averages_included(tmp_path, contexts):
    X, y = classification_data(n=120)

    def averages():
        bn_data = mx.io.NDArrayIter(X, y, batch_size=30, label_name="softmax_label")
        return [
            ExponentialMovingAverage(decay=0.9),
            StochasticWeightAveraging(start_epoch=1, data=bn_data),
        ]

    full_averages, resumed = averages(), averages()
    full = loop_of(full_averages, contexts, net=bn_net(), directory=tmp_path / "full", epochs=4)
    full.run()
    stop = FinishAfter(after_n_batches=14)  # mid-epoch, the SWA of epoch 1 taken
    loop_of(averages(), contexts, net=bn_net(), directory=tmp_path / "cut", stop=stop).run()
    again = loop_of(
        resumed, contexts, net=bn_net(), directory=tmp_path / "cut", resume=True, epochs=4
    )
    assert again.resumed_from is not None
    again.run()
    assert_identical(host(full.get_params()[0]), host(again.get_params()[0]))
    for ours, theirs in zip(full_averages, resumed):
        assert_identical(host(ours.get_params()[0]), host(theirs.get_params()[0]))
    # SWA's own statistics (the EMA's are the loop's, which a mid-epoch save on two devices
    # averages over them: MainLoop's Notes).
    assert_identical(host(full_averages[1].get_params()[1]), host(resumed[1].get_params()[1]))


def test_each_checkpoint_holds_the_averaged_model_in_mxnets_format(tmp_path):
    from mxoid.checkpoint import latest_checkpoint

    ema = ExponentialMovingAverage(decay=0.9)
    loop_of([ema], ONE_CPU, directory=tmp_path / "run", epochs=2).run()
    folder = latest_checkpoint(str(tmp_path / "run"))
    module = mx.mod.Module.load(f"{folder.path}/ema", 2)
    module.bind(data_shapes=[("data", (20, 10))], label_shapes=[("softmax_label", (20,))])
    assert_identical(host(module.get_params()[0]), host(ema.get_params()[0]))
