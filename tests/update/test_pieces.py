"""The pieces as the seed meant them: a loop of one's own from the executor manager, the
kvstore and optimizer helpers and the update functions, equal to MainLoop; their misuse named.
"""

import mxnet as mx
import numpy as np
import pytest
from conftest import TWO_CPUS, classification_data, initial_params, mlp

from mxoid import DataParallelExecutorManager, FinishAfter, MainLoop
from mxoid.update import (
    create_kvstore,
    create_optimizer,
    initialize_kvstore,
    kvstore_keys,
    update_params,
    update_params_on_kvstore,
)

OPTIMIZER_PARAMS = {"learning_rate": 0.1, "momentum": 0.9, "wd": 1e-3}
CONTEXTS = {"one": [mx.cpu(0)], "two": TWO_CPUS}


def batches(X, y):
    return mx.io.NDArrayIter(X, y, batch_size=20, shuffle=False, label_name="softmax_label")


def hand_loop(contexts, on_kvstore, X, y, params, epochs=2):
    """What the README's "Your own loop from the pieces" writes, as a user would."""
    net = mlp()
    train = batches(X, y)
    manager = DataParallelExecutorManager(net, contexts, train.provide_data, train.provide_label)
    manager.set_params(params)
    kvstore, on_kvstore = create_kvstore("local", len(contexts), on_kvstore)
    optimizer = create_optimizer(
        "sgd",
        dict(OPTIMIZER_PARAMS),
        symbol=net,
        param_names=manager.param_names,
        num_devices=len(contexts),
        batch_size=20,
        kvstore=kvstore,
        update_on_kvstore=on_kvstore,
    )
    keys = kvstore_keys(kvstore, manager.param_names)
    if kvstore is not None:
        initialize_kvstore(
            kvstore, manager.param_arrays, params, manager.param_names, on_kvstore, keys
        )
    if on_kvstore:
        kvstore.set_optimizer(optimizer)
    updater = None if on_kvstore else mx.optimizer.get_updater(optimizer)
    for _ in range(epochs):
        train.reset()
        for batch in train:
            manager.load_data_batch(batch)
            manager.forward(is_train=True)
            manager.backward()
            if on_kvstore:
                update_params_on_kvstore(manager.param_arrays, manager.grad_arrays, kvstore, keys)
            else:
                update_params(
                    manager.param_arrays, manager.grad_arrays, updater, len(contexts), kvstore, keys
                )
    return {k: v.asnumpy() for k, v in manager.get_params()[0].items()}


@pytest.mark.parametrize("on_kvstore", [True, False], ids=["on-kvstore", "local-updater"])
@pytest.mark.parametrize("devices", ["one", "two"])
def test_a_hand_written_loop_from_the_pieces_equals_main_loop(devices, on_kvstore):
    X, y = classification_data(n=60)
    params = initial_params(mlp(), (20, 10))
    ours = hand_loop(CONTEXTS[devices], on_kvstore, X, y, params)
    loop = MainLoop(
        mlp(),
        batches(X, y),
        contexts=CONTEXTS[devices],
        optimizer_params=dict(OPTIMIZER_PARAMS),
        arg_params=params,
        update_on_kvstore=on_kvstore,
        extensions=[FinishAfter(after_n_epochs=2)],
    ).run()
    for name, value in loop.get_params()[0].items():
        assert not np.array_equal(value.asnumpy(), params[name].asnumpy()), name
        np.testing.assert_allclose(ours[name], value.asnumpy(), rtol=1e-6, atol=1e-6, err_msg=name)


# ------------------------------------------------------------------ misuse
def test_initialize_kvstore_without_a_kvstore_says_to_skip_it():
    kvstore, _ = create_kvstore("local", 1)
    assert kvstore is None
    with pytest.raises(TypeError, match="nothing to initialize. Skip initialize_kvstore"):
        initialize_kvstore(kvstore, [], {}, [], False)


def test_update_params_on_kvstore_without_a_kvstore_names_update_params():
    with pytest.raises(TypeError, match=r"update_params\(param_arrays, grad_arrays, updater, 1\)"):
        update_params_on_kvstore([], [], None, [])


def a_manager_on_two_devices():
    net = mlp()
    X, y = classification_data(n=20)
    train = batches(X, y)
    manager = DataParallelExecutorManager(net, TWO_CPUS, train.provide_data, train.provide_label)
    manager.set_params(initial_params(net, (20, 10)))
    manager.load_data_batch(next(iter(train)))
    manager.forward(is_train=True)
    manager.backward()
    return net, manager


def test_an_optimizer_made_for_the_kvstore_is_refused_by_a_local_updater():
    """The trap: per-name settings landing on other parameters (indices i * devices + k)."""
    net, manager = a_manager_on_two_devices()
    names = manager.param_names
    optimizer = mx.optimizer.create(
        "sgd", sym=net, param_idx2name=dict(enumerate(names)), **OPTIMIZER_PARAMS
    )
    kvstore = mx.kv.create("local")
    initialize_kvstore(kvstore, manager.param_arrays, manager.get_params()[0], names, False)
    with pytest.raises(ValueError, match=r"has 4 entries for 4 parameters on 2 devices") as raised:
        update_params(
            manager.param_arrays,
            manager.grad_arrays,
            mx.optimizer.get_updater(optimizer),
            2,
            kvstore,
            names,
        )
    assert "create_optimizer(..., update_on_kvstore=False)" in str(raised.value)


def test_an_optimizer_made_for_local_updaters_is_refused_by_the_kvstore():
    net, manager = a_manager_on_two_devices()
    names = manager.param_names
    optimizer = create_optimizer(
        "sgd",
        dict(OPTIMIZER_PARAMS),
        symbol=net,
        param_names=names,
        num_devices=2,
        batch_size=20,
        kvstore=None,
        update_on_kvstore=False,
    )
    kvstore = mx.kv.create("local")
    initialize_kvstore(kvstore, manager.param_arrays, manager.get_params()[0], names, True)
    kvstore.set_optimizer(optimizer)
    with pytest.raises(ValueError, match="has 8 entries for 4 parameters on 2 devices") as raised:
        update_params_on_kvstore(manager.param_arrays, manager.grad_arrays, kvstore, names)
    assert "create_optimizer(..., update_on_kvstore=True)" in str(raised.value)


def test_on_one_device_both_index_maps_are_the_same_and_accepted():
    net = mlp()
    X, y = classification_data(n=20)
    train = batches(X, y)
    manager = DataParallelExecutorManager(net, [mx.cpu()], train.provide_data, train.provide_label)
    manager.set_params(initial_params(net, (20, 10)))
    manager.load_data_batch(next(iter(train)))
    manager.forward(is_train=True)
    manager.backward()
    optimizer = mx.optimizer.create(
        "sgd", sym=net, param_idx2name=dict(enumerate(manager.param_names)), **OPTIMIZER_PARAMS
    )
    update_params(manager.param_arrays, manager.grad_arrays, mx.optimizer.get_updater(optimizer), 1)


@pytest.mark.parametrize("devices", ["one", "two"])
def test_the_readmes_own_loop_runs_and_equals_main_loop(devices):
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = text[text.index("\n## Your own loop from the pieces") :]
    section = section[: section.index("\n## ", 5)]
    block = re.findall(r"```python\n(.*?)```", section, re.S)[0]  # the loop (then its use)
    namespace = {}
    exec(compile(block, "README.md", "exec"), namespace)
    X, y = classification_data(n=60)
    params = initial_params(mlp(), (20, 10))
    args, _ = namespace["own_loop"](mlp(), batches(X, y), CONTEXTS[devices], params, epochs=2)
    loop = MainLoop(
        mlp(),
        batches(X, y),
        contexts=CONTEXTS[devices],
        optimizer_params={"learning_rate": 0.1, "momentum": 0.9},
        arg_params=params,
        extensions=[FinishAfter(after_n_epochs=2)],
    ).run()
    for name, value in loop.get_params()[0].items():
        np.testing.assert_allclose(
            args[name].asnumpy(), value.asnumpy(), rtol=1e-6, atol=1e-6, err_msg=name
        )
