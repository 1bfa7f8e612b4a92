"""DataParallelExecutorManager in MXNet's own form (issue 40.5): built as
``mx.executor_manager.DataParallelExecutorManager`` is, each of its methods and arrays gives
what MXNet's gives; sym_gen's buckets switch per batch; wrong arguments are named.
"""

import logging
import random

import mxnet as mx
import numpy as np
import pytest
from conftest import TWO_CPUS, classification_data, initial_params

from mxoid import DataParallelExecutorManager

THEIRS = mx.executor_manager.DataParallelExecutorManager
LABELS_GRADIENT = "softmax_backward_output1"


def batch_norm_net():
    data = mx.sym.Variable("data")
    hidden = mx.sym.FullyConnected(data, num_hidden=16, name="fc1")
    hidden = mx.sym.Activation(mx.sym.BatchNorm(hidden, name="bn1"), act_type="relu")
    logits = mx.sym.FullyConnected(hidden, num_hidden=3, name="fc2")
    return mx.sym.SoftmaxOutput(logits, name="softmax")


def names(symbol):
    arg_names = symbol.list_arguments()
    params = [n for n in arg_names if n not in ("data", "softmax_label")]
    return arg_names, params, symbol.list_auxiliary_states()


def iterator():
    X, y = classification_data(n=40)
    return mx.io.NDArrayIter(X, y, batch_size=20, label_name="softmax_label")


def aux_values(symbol, seed=2):
    rng = np.random.RandomState(seed)
    _, _, shapes = symbol.infer_shape(data=(20, 10))
    return {
        n: mx.nd.array(rng.uniform(0.5, 1.5, s))
        for n, s in zip(symbol.list_auxiliary_states(), shapes)
    }


def one_pass(manager, train_data, monitor=None):
    """set_params, then a batch forward and backward; the stats a monitor printed."""
    net = manager.symbol
    manager.set_params(initial_params(net, (20, 10)), aux_values(net))
    train_data.reset()
    batch = next(train_data)
    if monitor is not None:
        manager.install_monitor(monitor)
        monitor.tic()
    manager.load_data_batch(batch)
    manager.forward(is_train=True)
    manager.backward()
    mx.nd.waitall()
    return batch, (monitor.toc() if monitor is not None else None)


def host(arrays):
    return [[None if a is None else a.asnumpy() for a in per_device] for per_device in arrays]


@pytest.mark.parametrize("form", ["positional", "keywords", "mixed"])
def test_built_as_mxnets_its_arrays_metric_monitor_and_copy_are_mxnets(form):
    net = batch_norm_net()
    arg_names, param_names, aux_names = names(net)
    it = iterator()
    if form == "positional":
        ours = DataParallelExecutorManager(net, TWO_CPUS, it, arg_names, param_names, aux_names)
    elif form == "keywords":
        ours = DataParallelExecutorManager(
            symbol=net,
            ctx=TWO_CPUS,
            train_data=it,
            arg_names=arg_names,
            param_names=param_names,
            aux_names=aux_names,
            work_load_list=[1, 1],
            logger=logging.getLogger("seed"),
        )
    else:
        ours = DataParallelExecutorManager(
            net, TWO_CPUS, it, arg_names, param_names, aux_names, [1, 1], None, None
        )
    theirs = THEIRS(net, TWO_CPUS, iterator(), arg_names, param_names, aux_names)
    results = {}
    for who, manager in (("ours", ours), ("theirs", theirs)):
        monitor = mx.monitor.Monitor(1, pattern=".*")
        batch, stats = one_pass(manager, iterator(), monitor)
        metric, sliced = mx.metric.Accuracy(), mx.metric.Accuracy()
        manager.update_metric(metric, batch.label)
        per_device = [[label[s] for label in batch.label] for s in (slice(0, 10), slice(10, 20))]
        manager.update_metric(sliced, per_device, pre_sliced=True)
        args = {n: mx.nd.zeros(v.shape) for n, v in initial_params(net, (20, 10)).items()}
        aux = {n: mx.nd.zeros(v.shape, dtype="float64") for n, v in aux_values(net).items()}
        manager.copy_to(args, aux)
        results[who] = {
            "arrays": [host(manager.param_arrays), host(manager.grad_arrays)],
            "aux": host(manager.aux_arrays),
            "metrics": (metric.get(), sliced.get()),
            "monitor": [  # but the label's gradient: no one binds it (uninitialized memory)
                (step, name, value) for step, name, value in stats if name != LABELS_GRADIENT
            ],
            "copies": {n: v.asnumpy() for n, v in {**args, **aux}.items()},
            "names": (manager.param_names, manager.aux_names),
        }
    ours, theirs = results["ours"], results["theirs"]
    assert ours["names"] == theirs["names"] and ours["metrics"] == theirs["metrics"]
    assert ours["monitor"] == theirs["monitor"] and len(ours["monitor"]) > 10
    for mine, their in zip(ours["arrays"] + [ours["aux"]], theirs["arrays"] + [theirs["aux"]]):
        for my_devices, their_devices in zip(mine, their):
            for a, b in zip(my_devices, their_devices):
                np.testing.assert_array_equal(a, b)
    for name, value in theirs["copies"].items():  # the aux states: the devices' average
        assert ours["copies"][name].dtype == value.dtype
        np.testing.assert_array_equal(ours["copies"][name], value, name)


VOCABULARY = 12


def sgd():
    return mx.optimizer.create("sgd", learning_rate=0.5, rescale_grad=1 / 4)


def sym_gen(seq_len):
    """MXNet's old sym_gen: a bucket key's symbol (its parameters the same for every key)."""
    data, label = mx.sym.Variable("data"), mx.sym.Variable("softmax_label")
    embedded = mx.sym.Embedding(data, input_dim=VOCABULARY, output_dim=6, name="embed")
    hidden = mx.sym.Reshape(embedded, shape=(-1, 6))
    pred = mx.sym.FullyConnected(hidden, num_hidden=VOCABULARY, name="pred")
    return mx.sym.SoftmaxOutput(pred, mx.sym.Reshape(label, shape=(-1,)), name="softmax")


def sentences():
    rng = np.random.RandomState(3)
    return [list(rng.randint(1, VOCABULARY, size=rng.choice([3, 5]))) for _ in range(40)]


def bucket_iterator():
    np.random.seed(4)  # BucketSentenceIter shuffles with NumPy's and Python's generators
    random.seed(4)
    return mx.rnn.BucketSentenceIter(sentences(), 4, buckets=[3, 5], invalid_label=0)


def bucket_params(net, param_names):
    shapes = dict(zip(net.list_arguments(), net.infer_shape(data=(4, 5), softmax_label=(4, 5))[0]))
    rng = np.random.RandomState(5)
    return {n: mx.nd.array(rng.uniform(-0.3, 0.3, shapes[n])) for n in param_names}


def bucket_loop():
    """mxoid's manager in MXNet's form with sym_gen, trained with a local updater."""
    it = bucket_iterator()
    net = sym_gen(it.default_bucket_key)
    arg_names = net.list_arguments()
    param_names = [n for n in arg_names if n not in ("data", "softmax_label")]
    manager = DataParallelExecutorManager(
        net, [mx.cpu(0)], it, arg_names, param_names, [], sym_gen=sym_gen
    )
    params = bucket_params(net, param_names)
    manager.set_params(params, {})
    updater = mx.optimizer.get_updater(sgd())
    metric, keys = mx.metric.Accuracy(), []
    for batch in it:
        keys.append(batch.bucket_key)
        manager.load_data_batch(batch)
        manager.forward(is_train=True)
        manager.backward()
        mx.model._update_params(manager.param_arrays, manager.grad_arrays, updater, 1)
        manager.update_metric(metric, batch.label)
    copies = {n: mx.nd.zeros(v.shape) for n, v in params.items()}
    manager.copy_to(copies, {})
    return keys, metric.get(), {n: v.asnumpy() for n, v in copies.items()}, manager


def bucketing_module_loop():
    """The same with MXNet's BucketingModule (MXNet 1.9.1's manager cannot bind a bucket
    smaller than the default one: its shared input arrays are reshaped to fewer elements)."""
    it = bucket_iterator()
    module = mx.mod.BucketingModule(
        lambda key: (sym_gen(key), ("data",), ("softmax_label",)),
        default_bucket_key=it.default_bucket_key,
        context=[mx.cpu(0)],
    )
    module.bind(it.provide_data, it.provide_label)
    net = sym_gen(it.default_bucket_key)
    module.init_params(arg_params=bucket_params(net, net.list_arguments()[1:-1]))
    module.init_optimizer(kvstore=None, optimizer=sgd())
    metric, keys = mx.metric.Accuracy(), []
    for batch in it:
        keys.append(batch.bucket_key)
        module.forward(batch, is_train=True)
        module.backward()
        module.update()
        module.update_metric(metric, batch.label)
    return keys, metric.get(), {n: v.asnumpy() for n, v in module.get_params()[0].items()}


def test_sym_gen_switches_bucket_per_batch_as_mxnets_bucketing():
    keys, metric, params, ours = bucket_loop()
    their_keys, their_metric, their_params = bucketing_module_loop()
    assert keys == their_keys and set(keys) == {3, 5} and metric == their_metric
    assert sorted(params) == sorted(their_params) == ["embed_weight", "pred_bias", "pred_weight"]
    for name, value in their_params.items():
        np.testing.assert_array_equal(params[name], value, name)
    with pytest.raises(NotImplementedError, match="not implemented for bucketing"):
        ours.install_monitor(mx.monitor.Monitor(1))


def test_mxnets_form_with_wrong_or_missing_arguments_is_named():
    net = batch_norm_net()
    arg_names, param_names, aux_names = names(net)
    it = iterator()
    with pytest.raises(ValueError, match=r"param_names \['fc2_bias'.*symbol's"):
        DataParallelExecutorManager(net, TWO_CPUS, it, arg_names, param_names[::-1], aux_names)
    with pytest.raises(ValueError, match="aux_names"):
        DataParallelExecutorManager(net, TWO_CPUS, it, arg_names, param_names, [])
    with pytest.raises(TypeError, match="without arg_names, param_names, aux_names"):
        DataParallelExecutorManager(net, TWO_CPUS, it)
    with pytest.raises(TypeError, match="multiple values for 'arg_names'"):
        DataParallelExecutorManager(
            net, TWO_CPUS, it, arg_names, param_names, aux_names, arg_names=arg_names
        )
    with pytest.raises(TypeError, match="mxoid's form .* or MXNet's"):
        DataParallelExecutorManager(net, TWO_CPUS)
    mxoids = DataParallelExecutorManager(net, TWO_CPUS, it.provide_data, it.provide_label)
    assert mxoids.sym_gen is None and mxoids.param_names == param_names
