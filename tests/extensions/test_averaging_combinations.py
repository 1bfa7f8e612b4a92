"""EMA and SWA with the loop's other pieces: gradient accumulation, buckets, Gluon blocks, and
mixed precision; each against NumPy's average of the parameter trajectory, each resumed
exactly. (Distributed training: tests/distributed/test_averaging_distributed.py.)"""

import mxnet as mx
import numpy as np
import pytest
from buckets import OPTIMIZER_PARAMS as BUCKET_OPTIMIZER
from buckets import bucket_iter, sym_gen_of
from buckets import initial_params as bucket_params
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
from mxoid.checkpoint import latest_checkpoint

ONE_CPU = [mx.cpu(0)]
DEVICES = {"one": ONE_CPU, "two": TWO_CPUS}


class Trajectory(Extension):
    """The parameters before training, after every optimizer step (with the number of the
    batch it followed) and at every epoch end."""

    def __init__(self):
        super().__init__(priority=-1)
        self.steps, self.batches, self.epochs = [], [], []

    def _read(self):
        return {k: v.asnumpy() for k, v in self.main_loop.get_params()[0].items()}

    def before_training(self):
        self.steps.append(self._read())

    def after_update(self):
        self.steps.append(self._read())
        self.batches.append(self.main_loop.status.iterations_done + 1)

    def after_epoch(self):
        self.epochs.append(self._read())


def host(params):
    return {k: v.asnumpy() for k, v in params.items()}


def ema_of(steps, decay, moves=None):
    """NumPy's exponential moving average of ``steps`` (moving at ``moves``, all by default)."""
    expected = dict(steps[0])
    for number, step in enumerate(steps[1:]):
        if moves is None or moves[number]:
            expected = {k: decay * expected[k] + (1 - decay) * step[k] for k in expected}
    return expected


def assert_close(ours, expected):
    for name in expected:
        np.testing.assert_allclose(ours[name], expected[name], rtol=1e-5, atol=1e-6, err_msg=name)


def bn_net():
    data = mx.sym.Variable("data")
    hidden = mx.sym.FullyConnected(data, num_hidden=8, name="fc1")
    hidden = mx.sym.BatchNorm(hidden, name="bn1", fix_gamma=False)
    hidden = mx.sym.Activation(hidden, act_type="relu")
    return mx.sym.SoftmaxOutput(
        mx.sym.FullyConnected(hidden, num_hidden=3, name="fc2"), name="softmax"
    )


def symbol_loop(extensions, contexts, *, net=None, epochs=3, stop=None, directory=None, **options):
    X, y = classification_data(n=120)
    net = mlp() if net is None else net
    saving = [Checkpoint(str(directory), every_n_batches=3)] if directory else []
    resume = options.pop("resume", False)
    return MainLoop(
        net,
        mx.io.NDArrayIter(X, y, batch_size=20, label_name="softmax_label"),
        contexts=contexts,
        optimizer_params={"learning_rate": 0.1, "momentum": 0.9},
        arg_params=initial_params(net, (20, 10)),
        extensions=[stop or FinishAfter(after_n_epochs=epochs), *saving, *extensions],
        resume_from=str(directory) if resume else None,
        **options,
    )


# ------------------------------------------------------------------ accumulation
@pytest.mark.parametrize("devices", ["one", "two"])
def test_ema_with_accumulation_moves_after_each_optimizer_step(devices):
    """accumulate_batches=2: 6 batches an epoch, 3 steps; the EMA moves after each step."""
    trajectory, ema = Trajectory(), ExponentialMovingAverage(decay=0.9)
    symbol_loop([trajectory, ema], DEVICES[devices], accumulate_batches=2).run()
    assert trajectory.batches == list(range(2, 19, 2))
    assert_close(host(ema.get_params()[0]), ema_of(trajectory.steps, 0.9))


def test_ema_every_n_batches_with_accumulation_counts_the_steps_batches():
    """every_n_batches=4 with accumulate_batches=2: after the steps of batches 4, 8, 12...,
    every second step (the batch's number, as every firing condition counts)."""
    trajectory, ema = Trajectory(), ExponentialMovingAverage(decay=0.5, every_n_batches=4)
    symbol_loop([trajectory, ema], ONE_CPU, accumulate_batches=2).run()
    moves = [batch % 4 == 0 for batch in trajectory.batches]
    assert moves == [False, True] * 4 + [False]
    assert_close(host(ema.get_params()[0]), ema_of(trajectory.steps, 0.5, moves))


@pytest.mark.parametrize("devices", ["one", "two"])
def test_swa_with_accumulation_groups_spanning_epoch_ends(devices):
    """accumulate_batches=4 over epochs of 6 batches: the epochs' ends fall inside groups;
    SWA takes the parameters as they are there (the last step's), and their BatchNorm
    statistics from its own pass."""
    X, y = classification_data(n=120)
    bn_data = mx.io.NDArrayIter(X, y, batch_size=30, label_name="softmax_label")
    trajectory = Trajectory()
    swa = StochasticWeightAveraging(start_epoch=1, data=bn_data)
    symbol_loop([trajectory, swa], DEVICES[devices], net=bn_net(), accumulate_batches=4).run()
    assert trajectory.batches == [4, 8, 12, 16]
    arg = host(swa.get_params()[0])
    assert_close(arg, {k: np.mean([e[k] for e in trajectory.epochs], 0) for k in arg})


@pytest.mark.parametrize("devices", ["one", "two"])
def test_averages_with_accumulation_resume_mid_group_exactly(tmp_path, devices):
    """Stopped after batch 7 (a group of 2 half done, its gradients in the checkpoint)."""

    def averages():
        return [ExponentialMovingAverage(decay=0.9), StochasticWeightAveraging(start_epoch=1)]

    def run(directory, stop, extensions, resume=False):
        return symbol_loop(
            extensions,
            DEVICES[devices],
            stop=stop,
            directory=directory,
            accumulate_batches=2,
            resume=resume,
        )

    full_averages, resumed = averages(), averages()
    full = run(tmp_path / "full", FinishAfter(after_n_epochs=3), full_averages)
    full.run()
    with pytest.warns(UserWarning, match="1 batch\\(es\\) into a group"):
        run(tmp_path / "cut", FinishAfter(after_n_batches=7), averages()).run()
    again = run(tmp_path / "cut", FinishAfter(after_n_epochs=3), resumed, resume=True)
    assert again.resumed_from is not None
    again.run()
    assert_identical(host(full.get_params()[0]), host(again.get_params()[0]))
    for ours, theirs in zip(full_averages, resumed):
        assert_identical(host(ours.get_params()[0]), host(theirs.get_params()[0]))


# ----------------------------------------------------------------------- buckets
def bucket_loop(extensions, contexts, *, stop=None, directory=None, resume=False):
    sym_gen = sym_gen_of()
    saving = [Checkpoint(str(directory), every_n_batches=5)] if directory else []
    return MainLoop(
        sym_gen,
        bucket_iter(),
        contexts=contexts,
        optimizer_params=dict(BUCKET_OPTIMIZER),
        arg_params=bucket_params(sym_gen),
        extensions=[stop or FinishAfter(after_n_epochs=2), *saving, *extensions],
        resume_from=str(directory) if resume else None,
    )


@pytest.mark.filterwarnings("ignore:train_data .an mx.rnn.BucketSentenceIter")
@pytest.mark.parametrize("devices", ["one", "two"])
def test_averages_of_a_bucketed_lstm_equal_numpys(devices):
    """MXNet's LSTM over buckets of 4, 8 and 12 tokens: every bucket's steps move the EMA
    (the buckets share the parameters); SWA is the mean of the epochs' parameters."""
    trajectory = Trajectory()
    ema, swa = ExponentialMovingAverage(decay=0.8), StochasticWeightAveraging(start_epoch=1)
    loop = bucket_loop([trajectory, ema, swa], DEVICES[devices]).run()
    assert len(loop.manager.executor_sets) == 2  # buckets 4 and 8 bound beside 12
    assert_close(host(ema.get_params()[0]), ema_of(trajectory.steps, 0.8))
    arg = host(swa.get_params()[0])
    assert_close(arg, {k: np.mean([e[k] for e in trajectory.epochs], 0) for k in arg})


@pytest.mark.filterwarnings("ignore:train_data .an mx.rnn.BucketSentenceIter")
def test_averages_of_a_bucketed_lstm_resume_mid_epoch_exactly(tmp_path):
    def averages():
        return [ExponentialMovingAverage(decay=0.8), StochasticWeightAveraging(start_epoch=1)]

    full_averages, resumed = averages(), averages()
    full = bucket_loop(full_averages, ONE_CPU, directory=tmp_path / "full").run()
    cut = FinishAfter(after_n_batches=20)  # 14 batches an epoch: mid-epoch 2
    bucket_loop(averages(), ONE_CPU, stop=cut, directory=tmp_path / "cut").run()
    again = bucket_loop(resumed, ONE_CPU, directory=tmp_path / "cut", resume=True)
    assert again.resumed_from is not None
    again.run()
    assert_identical(host(full.get_params()[0]), host(again.get_params()[0]))
    for ours, theirs in zip(full_averages, resumed):
        assert_identical(host(ours.get_params()[0]), host(theirs.get_params()[0]))


def bn_sym_gen(seq_len):
    """Tokens embedded, BatchNorm over every token's embedding, a softmax per token."""
    from buckets import VOCAB

    data, label = mx.sym.Variable("data"), mx.sym.Variable("softmax_label")
    embed = mx.sym.Embedding(data=data, input_dim=VOCAB, output_dim=8, name="embed")
    hidden = mx.sym.BatchNorm(mx.sym.Reshape(embed, shape=(-1, 8)), name="bn", fix_gamma=False)
    pred = mx.sym.FullyConnected(hidden, num_hidden=VOCAB, name="pred")
    label = mx.sym.Reshape(label, shape=(-1,))
    return mx.sym.SoftmaxOutput(pred, label=label, name="softmax"), ("data",), ("softmax_label",)


@pytest.mark.filterwarnings("ignore:train_data .an mx.rnn.BucketSentenceIter")
@pytest.mark.parametrize("devices", ["one", "two"])
def test_swa_recomputes_batchnorm_over_batches_of_every_bucket(devices):
    """SWA's pass reads each batch on its bucket's graph (bound on first use): by hand, the
    averaged embedding of each batch's tokens, its mean and variance, averaged."""
    from buckets import Replay

    data = Replay(bucket_iter(seed=5))
    assert len({batch.bucket_key for batch in data.batches}) == 3
    swa = StochasticWeightAveraging(start_epoch=1, data=data)
    mx.random.seed(2)
    MainLoop(
        bn_sym_gen,
        bucket_iter(),
        contexts=DEVICES[devices],
        initializer=mx.init.Xavier(),
        optimizer_params={"learning_rate": 0.1},
        extensions=[FinishAfter(after_n_epochs=2), swa],
    ).run()
    arg, aux = (host(p) for p in swa.get_params())
    rows = [arg["embed_weight"][b.data[0].asnumpy().astype(int).reshape(-1)] for b in data.batches]
    for name, statistic in (("mean", np.mean), ("var", np.var)):
        expected = np.mean([statistic(r, axis=0) for r in rows], 0)
        np.testing.assert_allclose(aux[f"bn_moving_{name}"], expected, rtol=1e-4, atol=1e-6)


# ------------------------------------------------------------------------- Gluon
def gluon_block():
    from mxnet import gluon

    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(8), gluon.nn.BatchNorm(), gluon.nn.Activation("relu"))
    net.add(gluon.nn.Dense(3))
    net.initialize(mx.init.Xavier())
    net(mx.nd.zeros((1, 10)))  # the shapes known: the same initial values for every loop
    return net


def gluon_loop(net, extensions, contexts, *, stop=None, directory=None, resume=False):
    from mxnet import gluon

    X, y = classification_data(n=120)
    saving = [Checkpoint(str(directory), every_n_batches=4)] if directory else []
    return MainLoop(
        net,
        mx.io.NDArrayIter(X, y, batch_size=20, label_name="label"),
        loss=gluon.loss.SoftmaxCrossEntropyLoss(),
        contexts=contexts,
        optimizer_params={"learning_rate": 0.1, "momentum": 0.9},
        extensions=[stop or FinishAfter(after_n_epochs=3), *saving, *extensions],
        resume_from=str(directory) if resume else None,
    )


def block_values(net):
    return {p.name: p.data().asnumpy() for p in net.collect_params().values()}


@pytest.mark.parametrize("devices", ["one", "two"])
def test_averages_of_a_gluon_block_equal_numpys_and_gluon_evaluates_them(devices, tmp_path):
    """A Dense-BatchNorm block: the EMA and SWA equal NumPy's averages; SWA's BatchNorm
    statistics are Dense(x)'s on its data by hand; the checkpoint's ``ema-net.params`` loads
    in the block (``load_parameters``), whose Gluon forward pass then gives the accuracy
    Evaluate(parameters=ema) recorded."""
    X, y = classification_data(n=120)
    mx.random.seed(4)
    net = gluon_block()
    trajectory = Trajectory()
    ema = ExponentialMovingAverage(decay=0.9)
    bn_data = mx.io.NDArrayIter(X, y, batch_size=30, label_name="label")
    swa = StochasticWeightAveraging(start_epoch=1, data=bn_data)
    valid = mx.io.NDArrayIter(X, y, batch_size=20, label_name="label")
    evaluate = Evaluate({"ema_valid": valid}, {"output": "acc"}, parameters=ema, name="ema")
    extensions = [trajectory, ema, swa, evaluate]
    loop = gluon_loop(net, extensions, DEVICES[devices], directory=tmp_path).run()
    assert_close(host(ema.get_params()[0]), ema_of(trajectory.steps, 0.9))
    arg, aux = (host(p) for p in swa.get_params())
    assert_close(arg, {k: np.mean([e[k] for e in trajectory.epochs], 0) for k in arg})
    weight, bias = arg[net[0].weight.name], arg[net[0].bias.name]
    h = [X[i : i + 30] @ weight.T + bias for i in range(0, 120, 30)]
    for name, statistic in ((net[1].running_mean.name, np.mean), (net[1].running_var.name, np.var)):
        expected = np.mean([statistic(b, axis=0) for b in h], 0)
        np.testing.assert_allclose(aux[name], expected, rtol=1e-4, atol=1e-5)
    folder = latest_checkpoint(str(tmp_path))
    net.load_parameters(f"{folder.path}/ema-net.params")
    ema_arg = host(ema.get_params()[0])
    for name, value in block_values(net).items():
        if name in ema_arg:
            np.testing.assert_array_equal(value, ema_arg[name], err_msg=name)
    by_hand = (net(mx.nd.array(X)).argmax(axis=1).asnumpy() == y).mean()
    assert loop.log.current_row["ema_valid_accuracy"] == pytest.approx(by_hand, abs=1e-12)


def test_averages_of_a_gluon_block_resume_mid_epoch_exactly(tmp_path):
    def averages():
        X, y = classification_data(n=120)
        bn_data = mx.io.NDArrayIter(X, y, batch_size=30, label_name="label")
        return [
            ExponentialMovingAverage(decay=0.9),
            StochasticWeightAveraging(start_epoch=1, data=bn_data),
        ]

    def block():
        mx.random.seed(4)
        return gluon_block()

    full_averages, resumed = averages(), averages()
    full = gluon_loop(block(), full_averages, ONE_CPU, directory=tmp_path / "full").run()
    cut = FinishAfter(after_n_batches=8)  # 6 batches an epoch: mid-epoch 2
    gluon_loop(block(), averages(), ONE_CPU, stop=cut, directory=tmp_path / "cut").run()
    # Another instance of the block, its parameters named otherwise (dense4_... for dense0_...)
    again = gluon_loop(block(), resumed, ONE_CPU, directory=tmp_path / "cut", resume=True)
    assert again.resumed_from is not None
    again.run()

    def by_place(params):  # the same places in the block, in the same order
        return dict(enumerate(host(params).values()))

    assert_identical(by_place(full.get_params()[0]), by_place(again.get_params()[0]))
    for ours, theirs in zip(full_averages, resumed):
        for mine, other in zip(ours.get_params(), theirs.get_params()):
            assert_identical(by_place(mine), by_place(other))


# --------------------------------------------------------------- mixed precision
def test_averages_under_bfloat16_equal_numpys():
    """The averages are of the float32 parameters, whatever the graph computes in."""
    from mxoid.precision import bfloat16_support

    if bfloat16_support() is not None:
        pytest.skip(f"this CPU does not compute bfloat16 ({bfloat16_support()})")
    trajectory = Trajectory()
    ema, swa = ExponentialMovingAverage(decay=0.9), StochasticWeightAveraging(start_epoch=1)
    symbol_loop([trajectory, ema, swa], ONE_CPU, mixed_precision="bfloat16").run()
    assert_close(host(ema.get_params()[0]), ema_of(trajectory.steps, 0.9))
    arg = host(swa.get_params()[0])
    assert all(v.dtype == np.float32 for v in arg.values())
    assert_close(arg, {k: np.mean([e[k] for e in trajectory.epochs], 0) for k in arg})
