"""The seed's own API beside mxoid's: a loop written against MXNet's executor manager and
``mx.model``'s kvstore and update functions trains the same on mxoid's pieces, only its
imports changed; each method of MXNet's manager gives what MXNet's gives (issue 40.5).
"""

import textwrap

import mxnet as mx
import numpy as np
import pytest
from conftest import TWO_CPUS, classification_data, initial_params

MXNET_IMPORTS = """
import mxnet as mx
from mxnet.executor_manager import DataParallelExecutorManager
from mxnet.model import _create_kvstore, _initialize_kvstore, _update_params
from mxnet.model import _update_params_on_kvstore
"""
MXOID_IMPORTS = """
import mxnet as mx
from mxoid import DataParallelExecutorManager
from mxoid.update import _create_kvstore, _initialize_kvstore, _update_params
from mxoid.update import _update_params_on_kvstore
"""
SEED_LOOP = textwrap.dedent(
    '''
    def train(symbol, ctx, train_data, arg_params, aux_params, kvstore, epochs, sym_gen=None):
        """The first mxoid's loop: MXNet's _train_multi_device, from its pieces."""
        arg_names = symbol.list_arguments()
        inputs = [desc[0] for desc in train_data.provide_data + train_data.provide_label]
        param_names = [name for name in arg_names if name not in inputs]
        aux_names = symbol.list_auxiliary_states()
        executor_manager = DataParallelExecutorManager(
            symbol=symbol,
            sym_gen=sym_gen,
            ctx=ctx,
            train_data=train_data,
            param_names=param_names,
            arg_names=arg_names,
            aux_names=aux_names,
            work_load_list=None,
            logger=None,
        )
        executor_manager.set_params(arg_params, aux_params)
        kv, update_on_kvstore = _create_kvstore(kvstore, len(ctx), arg_params)
        idx2name = {}
        if update_on_kvstore:
            idx2name.update(enumerate(param_names))
        else:
            for i, name in enumerate(param_names):
                for k in range(len(ctx)):
                    idx2name[i * len(ctx) + k] = name
        optimizer = mx.optimizer.create(
            "sgd",
            sym=symbol,
            param_idx2name=idx2name,
            rescale_grad=1.0 / train_data.batch_size,
            learning_rate=0.1,
            momentum=0.9,
            wd=1e-3,
        )
        if not update_on_kvstore:
            updater = mx.optimizer.get_updater(optimizer)
        else:
            kv.set_optimizer(optimizer)
        if kv:
            _initialize_kvstore(
                kvstore=kv,
                param_arrays=executor_manager.param_arrays,
                arg_params=arg_params,
                param_names=executor_manager.param_names,
                update_on_kvstore=update_on_kvstore,
            )
        eval_metric = mx.metric.create("acc")
        for _ in range(epochs):
            eval_metric.reset()
            train_data.reset()
            for data_batch in train_data:
                executor_manager.load_data_batch(data_batch)
                executor_manager.forward(is_train=True)
                executor_manager.backward()
                if update_on_kvstore:
                    _update_params_on_kvstore(
                        executor_manager.param_arrays,
                        executor_manager.grad_arrays,
                        kv,
                        executor_manager.param_names,
                    )
                else:
                    _update_params(
                        executor_manager.param_arrays,
                        executor_manager.grad_arrays,
                        updater=updater,
                        num_device=len(ctx),
                        kvstore=kv,
                        param_names=executor_manager.param_names,
                    )
                executor_manager.update_metric(eval_metric, data_batch.label)
            mx.nd.waitall()  # BatchNorm's statistics: a read waits for the backward pass
            executor_manager.copy_to(arg_params, aux_params)
        return arg_params, aux_params, eval_metric.get(), (kv, update_on_kvstore)
    '''
)


def seed_loop(imports):
    """The same loop's source under these imports: its ``train`` function."""
    namespace = {}
    exec(compile(imports + SEED_LOOP, "seed_loop", "exec"), namespace)
    return namespace["train"]


def batch_norm_net():
    data = mx.sym.Variable("data")
    hidden = mx.sym.FullyConnected(data, num_hidden=16, name="fc1")
    hidden = mx.sym.Activation(mx.sym.BatchNorm(hidden, name="bn1"), act_type="relu")
    logits = mx.sym.FullyConnected(hidden, num_hidden=3, name="fc2")
    return mx.sym.SoftmaxOutput(logits, name="softmax")


def initial_aux(symbol):
    _, _, shapes = symbol.infer_shape(data=(20, 10))
    names = symbol.list_auxiliary_states()
    return {
        n: mx.nd.ones(s) if n.endswith("var") else mx.nd.zeros(s) for n, s in zip(names, shapes)
    }


def copies(values):
    return {name: value.copy() for name, value in values.items()}


def run(imports, contexts, kvstore, epochs=2):
    X, y = classification_data(n=60)
    train_data = mx.io.NDArrayIter(X, y, batch_size=20, label_name="softmax_label")
    net = batch_norm_net()
    params = initial_params(net, (20, 10))
    return seed_loop(imports)(
        net, contexts, train_data, copies(params), initial_aux(net), kvstore, epochs
    )


CASES = {
    "one-device-local": ([mx.cpu(0)], "local", "1"),
    "one-device-device": ([mx.cpu(0)], "device", "1"),
    "one-device-none": ([mx.cpu(0)], None, "1"),
    "two-devices-local": (TWO_CPUS, "local", "1"),
    "two-devices-device": (TWO_CPUS, "device", "1"),
    "two-devices-local-updater": (TWO_CPUS, "local", "0"),  # MXNET_UPDATE_ON_KVSTORE=0
}


@pytest.mark.parametrize("case", list(CASES))
def test_mxnets_loop_trains_the_same_on_mxoids_pieces_with_only_its_imports_changed(
    case, monkeypatch
):
    contexts, kvstore, on_kvstore = CASES[case]
    monkeypatch.setenv("MXNET_UPDATE_ON_KVSTORE", on_kvstore)
    theirs = run(MXNET_IMPORTS, contexts, kvstore)
    ours = run(MXOID_IMPORTS, contexts, kvstore)
    (their_kv, their_path), (our_kv, our_path) = theirs[3], ours[3]
    assert (their_kv is None, their_path) == (our_kv is None, our_path)
    assert our_path == (len(contexts) > 1 and on_kvstore == "1")
    assert ours[2] == theirs[2] and ours[2][1] > 0.8  # the last epoch's training accuracy
    for mine, their in ((ours[0], theirs[0]), (ours[1], theirs[1])):
        assert sorted(mine) == sorted(their)
        for name in their:  # the same operations in the same order: bit-identical
            np.testing.assert_array_equal(mine[name].asnumpy(), their[name].asnumpy(), name)


def test_create_kvstore_decides_as_mxnets_and_refuses_no_kvstore_on_two_devices(monkeypatch):
    from mxoid.update import _create_kvstore

    monkeypatch.setenv("MXNET_UPDATE_ON_KVSTORE", "1")
    large = {"w": mx.nd.zeros((4097, 4097))}  # over 16M elements: 'local' updates locally
    small = {"w": mx.nd.zeros((2, 2))}
    for kvstore, params in (("local", large), ("local", small), ("device", large)):
        theirs = mx.model._create_kvstore(kvstore, 2, params)
        ours = _create_kvstore(kvstore, 2, params)
        assert (ours[0].type, ours[1]) == (theirs[0].type, theirs[1])
    assert _create_kvstore("local", 2, large)[1] is False
    kv = mx.kv.create("local")
    assert _create_kvstore(kv, 1, small) == mx.model._create_kvstore(kv, 1, small) == (kv, True)
    with pytest.raises(ValueError, match="each device on its own"):
        _create_kvstore(None, 2, small)  # MXNet's would train each device apart


def test_update_params_with_a_kvstore_and_no_names_says_what_is_missing():
    from mxoid.update import _update_params

    with pytest.raises(TypeError, match="needs param_names"):
        _update_params([], [], updater=None, num_device=2, kvstore=mx.kv.create("local"))
