"""DataParallelExecutorManager: splitting, outputs, padding, parameters, sharing."""

import mxnet as mx
import numpy as np
import pytest
from conftest import TWO_CPUS, classification_data, initial_params, mlp, two_heads

from mxoid import DataParallelExecutorManager
from mxoid.executor_manager.devices import split_batch


def numpy_mlp(params, X):
    hidden = np.maximum(X @ params["fc1_weight"].T + params["fc1_bias"], 0)
    logits = hidden @ params["fc2_weight"].T + params["fc2_bias"]
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def test_split_batch_follows_work_load():
    assert split_batch(10, [1, 1]) == [slice(0, 5), slice(5, 10)]
    assert split_batch(12, [1, 2]) == [slice(0, 4), slice(4, 12)]
    assert split_batch(7, [1, 1, 1]) == [slice(0, 2), slice(2, 4), slice(4, 7)]


def test_split_batch_refuses_batch_smaller_than_devices():
    with pytest.raises(ValueError, match="cannot be split across 3 devices"):
        split_batch(2, [1, 1, 1])


def test_forward_on_two_devices_equals_numpy():
    X, y = classification_data(n=12)
    net = mlp()
    params = initial_params(net, (6, 10))
    manager = DataParallelExecutorManager(
        net, TWO_CPUS, [("data", (6, 10))], [("softmax_label", (6,))]
    )
    assert [e._ctx for e in manager.executors] == TWO_CPUS
    manager.set_params(params, {})
    manager.load_data_batch(mx.io.DataBatch([mx.nd.array(X[:6])], [mx.nd.array(y[:6])]))
    manager.forward(is_train=False)
    outputs = manager.outputs["softmax"]
    assert manager.outputs["softmax_output"] is outputs
    got = np.concatenate([o.asnumpy() for o in outputs])
    expected = numpy_mlp({k: v.asnumpy() for k, v in params.items()}, X[:6])
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    assert [o.context for o in outputs] == TWO_CPUS


def test_multi_output_symbol_exposes_every_output_by_name():
    net = two_heads()
    manager = DataParallelExecutorManager(
        net, TWO_CPUS, [("data", (8, 10))], [("softmax_label", (8,)), ("reg_label", (8, 1))]
    )
    assert manager.output_names == ["softmax", "reg"]
    assert [o.shape for o in manager.outputs["reg"]] == [(4, 1), (4, 1)]
    assert set(manager.labels) == {"softmax_label", "reg_label"}
    with pytest.raises(KeyError, match="no output named 'nope'"):
        manager.outputs["nope"]


def test_padded_batch_marks_real_rows_per_device():
    net = mlp()
    manager = DataParallelExecutorManager(
        net, TWO_CPUS, [("data", (8, 10))], [("softmax_label", (8,))]
    )
    batch = mx.io.DataBatch([mx.nd.zeros((8, 10))], [mx.nd.zeros((8,))], pad=5)
    manager.load_data_batch(batch)
    assert manager.valid_rows == [3, 0]
    manager.load_data_batch(mx.io.DataBatch([mx.nd.zeros((8, 10))], [mx.nd.zeros((8,))], pad=0))
    assert manager.valid_rows == [4, 4]


def test_get_params_returns_host_copies_equal_to_set_params():
    net = mlp()
    params = initial_params(net, (4, 10))
    manager = DataParallelExecutorManager(
        net, TWO_CPUS, [("data", (4, 10))], [("softmax_label", (4,))]
    )
    manager.set_params(params, {})
    arg_params, aux_params = manager.get_params()
    assert aux_params == {}
    for name, value in params.items():
        assert arg_params[name].context == mx.cpu()
        np.testing.assert_array_equal(arg_params[name].asnumpy(), value.asnumpy())
    arg_params["fc1_weight"][:] = 0  # a copy: the executors keep their values
    assert manager.param_arrays[0][0].asnumpy().any()


def test_set_params_rejects_unknown_names_and_bad_shapes():
    net = mlp()
    manager = DataParallelExecutorManager(
        net, [mx.cpu()], [("data", (4, 10))], [("softmax_label", (4,))]
    )
    with pytest.raises(ValueError, match="'fc9_weight'"):
        manager.set_params({"fc9_weight": mx.nd.zeros((1,))})
    with pytest.raises(ValueError, match="shape"):
        manager.set_params({"fc1_weight": mx.nd.zeros((2, 2))})


def test_evaluation_manager_shares_parameters_and_sees_updates():
    """Executors for another batch size share the weights, and are not stale (MKLDNN trap)."""
    X, y = classification_data(n=30)
    net = mlp()
    params = initial_params(net, (8, 10))
    train = DataParallelExecutorManager(
        net, TWO_CPUS, [("data", (8, 10))], [("softmax_label", (8,))]
    )
    train.set_params(params, {})
    evaluation = train.evaluation_manager([("data", (5, 10))], [("softmax_label", (5,))])
    assert evaluation is train.evaluation_manager([("data", (5, 10))], [("softmax_label", (5,))])
    for shared, own in zip(train.param_arrays, evaluation.param_arrays):
        for a, b in zip(shared, own):
            assert a.handle.value == b.handle.value or a is b or _same_memory(a, b)

    def evaluate():
        evaluation.load_data_batch(mx.io.DataBatch([mx.nd.array(X[:5])], [mx.nd.array(y[:5])]))
        evaluation.forward(is_train=False)
        return np.concatenate([o.asnumpy() for o in evaluation.outputs["softmax"]])

    first = evaluate()
    current = {k: v.asnumpy() for k, v in train.get_params()[0].items()}
    np.testing.assert_allclose(first, numpy_mlp(current, X[:5]), rtol=1e-5, atol=1e-6)
    # Train a few steps: the evaluation executors must see the new weights.
    for step in range(3):
        train.load_data_batch(
            mx.io.DataBatch(
                [mx.nd.array(X[8 * step : 8 * step + 8])], [mx.nd.array(y[8 * step : 8 * step + 8])]
            )
        )
        train.forward(is_train=True)
        train.backward()
        for weights, grads in zip(train.param_arrays, train.grad_arrays):
            total = grads[0].copyto(mx.cpu()) + grads[1].copyto(mx.cpu())
            for w in weights:
                w[:] = w - 0.5 * total.as_in_context(w.context)
    current = {k: v.asnumpy() for k, v in train.get_params()[0].items()}
    assert not np.allclose(current["fc1_weight"], params["fc1_weight"].asnumpy())
    np.testing.assert_allclose(evaluate(), numpy_mlp(current, X[:5]), rtol=1e-5, atol=1e-6)


def _same_memory(a, b):
    a_before = a.asnumpy().copy()
    a[:] = a + 1
    same = np.allclose(b.asnumpy(), a_before + 1)
    a[:] = a - 1
    return same


def test_empty_contexts_are_refused():
    with pytest.raises(ValueError, match="contexts is empty"):
        DataParallelExecutorManager(mlp(), [], [("data", (4, 10))], [("softmax_label", (4,))])


def test_unknown_input_name_is_refused_with_the_symbols_arguments():
    with pytest.raises(ValueError, match="'label'.*softmax_label"):
        DataParallelExecutorManager(mlp(), [mx.cpu()], [("data", (4, 10))], [("label", (4,))])


def test_inputs_with_another_batch_size_are_refused():
    with pytest.raises(ValueError, match="rejects the input shapes") as info:
        DataParallelExecutorManager(
            mlp(), [mx.cpu()], [("data", (4, 10))], [("softmax_label", (5,))]
        )
    assert "Stack trace" not in str(info.value)
    assert "\n" not in str(info.value)


def test_shapes_the_operators_reject_give_a_clean_message():
    with pytest.raises(
        ValueError, match="rejects the input shapes.*Error in operator softmax"
    ) as info:
        DataParallelExecutorManager(
            mlp(), [mx.cpu()], [("data", (4, 10))], [("softmax_label", (4, 7))]
        )
    assert "Stack trace" not in str(info.value)
    assert "\n" not in str(info.value)
