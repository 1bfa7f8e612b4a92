"""Fine-tuning as Module.fit users do it: frozen layers, a pretrained model with a new head,
per-parameter learning rates, and parameters loaded from where MXNet and mxoid save them."""

import logging

import mxnet as mx
import numpy as np
import pytest
from conftest import TWO_CPUS
from networks import digits_images, dropout_lenet, initial_params

from mxoid import Checkpoint, FinishAfter, MainLoop, load_params
from mxoid.checkpoint import list_checkpoints

BATCH = 32
FROZEN = ["conv1_weight", "conv1_bias"]
DEVICES = {"one": [mx.cpu()], "two": TWO_CPUS}
OPTIMIZER_PARAMS = {"learning_rate": 0.1, "momentum": 0.9, "wd": 1e-4}


def lenet(num_classes=10):
    return dropout_lenet(num_classes=num_classes, p=0.25)


def digits_iter(X, y, shuffle=True, seed=3, batch_size=BATCH):
    np.random.seed(seed)
    return mx.io.NDArrayIter(
        X, y, batch_size=batch_size, shuffle=shuffle, label_name="softmax_label"
    )


def host(params):
    return {name: value.asnumpy() for name, value in params.items()}


# ------------------------------------------------------------ fixed_param_names
@pytest.mark.parametrize("devices", ["one", "two"])
def test_fixed_parameters_train_as_module_fit_and_never_move(devices):
    X, y = digits_images(256)
    net = lenet()
    args, aux = initial_params(net, (BATCH, 1, 8, 8))
    mx.random.seed(7)
    loop = MainLoop(
        net,
        digits_iter(X, y),
        contexts=DEVICES[devices],
        arg_params=args,
        aux_params=aux,
        optimizer_params=dict(OPTIMIZER_PARAMS),
        fixed_param_names=FROZEN,
        extensions=[FinishAfter(after_n_epochs=2)],
    ).run()
    ours = host(loop.get_params()[0])

    mx.random.seed(7)
    module = mx.mod.Module(
        net,
        context=DEVICES[devices],
        fixed_param_names=FROZEN,
        logger=logging.getLogger("quiet"),
    )
    module.fit(
        digits_iter(X, y),
        num_epoch=2,
        optimizer_params=dict(OPTIMIZER_PARAMS),
        arg_params=args,
        aux_params=aux,
    )
    theirs = host(module.get_params()[0])
    assert ours.keys() == theirs.keys()
    for name in ours:
        np.testing.assert_array_equal(ours[name], theirs[name], err_msg=name)
    for name in FROZEN:
        np.testing.assert_array_equal(ours[name], args[name].asnumpy(), err_msg=name)
    assert not np.array_equal(ours["fc1_weight"], args["fc1_weight"].asnumpy())
    assert all(grad is None for grad in loop.manager.grad_arrays[0])  # no gradient at all
    assert loop.manager.param_names[0] == "conv1_weight"


def test_fixed_parameters_keep_their_values_through_a_checkpoint_and_resumption(tmp_path):
    X, y = digits_images(128)
    net = lenet()
    args, aux = initial_params(net, (BATCH, 1, 8, 8))

    def make(epochs, resume):
        return MainLoop(
            net,
            digits_iter(X, y),
            arg_params=args,
            optimizer_params=dict(OPTIMIZER_PARAMS),
            fixed_param_names=FROZEN,
            resume_from=tmp_path if resume else None,
            extensions=[
                Checkpoint(tmp_path, every_n_batches=2),
                FinishAfter(after_n_epochs=epochs),
            ],
        )

    make(1, False).run()
    saved = load_params(list_checkpoints(str(tmp_path))[-1])[0]
    resumed = make(2, True).run()
    for name in FROZEN:
        np.testing.assert_array_equal(saved[name].asnumpy(), args[name].asnumpy())
        np.testing.assert_array_equal(resumed.get_params()[0][name].asnumpy(), args[name].asnumpy())


def test_a_mistyped_fixed_parameter_names_the_closest_ones():
    X, y = digits_images(64)
    with pytest.raises(ValueError, match=r"'conv1_weigth'.*did you mean 'conv1_weight'"):
        MainLoop(
            lenet(),
            digits_iter(X, y),
            fixed_param_names=["conv1_weigth"],
            extensions=[FinishAfter(after_n_epochs=1)],
        )


def test_fixed_parameters_have_no_backward_work():
    """grad_req='null': MXNet computes no gradient for them (a frozen first layer saves the
    gradient of the convolution's weight)."""
    X, y = digits_images(64)
    loop = MainLoop(
        lenet(),
        digits_iter(X, y),
        fixed_param_names=FROZEN,
        extensions=[FinishAfter(after_n_epochs=1)],
    )
    executor = loop.manager.executors[0]
    assert executor.grad_dict["conv1_weight"] is None
    assert executor.grad_dict["fc1_weight"] is not None


# ---------------------------------------------------------- a pretrained model
def pretrained(tmp_path, epochs=8):
    """LeNet trained on the digits 0-4, saved as Module saves it."""
    X, y = digits_images()
    low = y < 5
    net = lenet(num_classes=5)
    args, aux = initial_params(net, (BATCH, 1, 8, 8))
    mx.random.seed(1)
    loop = MainLoop(
        net,
        digits_iter(X[low], y[low]),
        arg_params=args,
        optimizer_params=dict(OPTIMIZER_PARAMS),
        extensions=[FinishAfter(after_n_epochs=epochs)],
    ).run()
    arg_params, aux_params = loop.get_params()
    prefix = str(tmp_path / "lenet-0-4")
    mx.model.save_checkpoint(prefix, epochs, net, arg_params, aux_params)
    return prefix


def test_fine_tuning_a_new_head_on_other_classes_with_frozen_convolutions(tmp_path):
    """The recipe of apache/mxnet #3708 / #11897: a pretrained body, a new head for other
    classes, the convolutions frozen. The digits 5-9, unseen by the pretrained model."""
    prefix = pretrained(tmp_path)
    arg_params, aux_params = load_params(prefix)
    X, y = digits_images()
    high = np.flatnonzero(y >= 5)
    rng = np.random.RandomState(0)
    rng.shuffle(high)
    train, held_out = high[:600], high[600:]
    net = lenet(num_classes=5)  # the same layers, a new head: its weights start anew
    for name in ("fc2_weight", "fc2_bias"):
        del arg_params[name]
    mx.random.seed(2)
    loop = MainLoop(
        net,
        digits_iter(X[train], y[train] - 5),
        arg_params=arg_params,
        aux_params=aux_params,
        initializer=mx.init.Xavier(),
        optimizer_params=dict(OPTIMIZER_PARAMS),
        fixed_param_names=FROZEN,
        extensions=[FinishAfter(after_n_epochs=10)],
    ).run()
    probabilities = loop.predict(digits_iter(X[held_out], y[held_out] - 5, shuffle=False))
    accuracy = np.mean(probabilities["softmax"].argmax(axis=1) == y[held_out] - 5)
    assert len(held_out) > 150
    assert accuracy >= 0.9, accuracy
    final = loop.get_params()[0]
    for name in FROZEN:
        np.testing.assert_array_equal(final[name].asnumpy(), load_params(prefix)[0][name].asnumpy())


def test_a_pretrained_model_with_another_head_is_a_clear_error_then_allow_extra(tmp_path, caplog):
    X, y = digits_images(64)
    arg_params, aux_params = load_params(pretrained(tmp_path, epochs=1))
    # Another head, named otherwise: the pretrained fc2 is extra.
    data = mx.sym.Variable("data")
    body = lenet().get_internals()["tanh2_output"]
    head = mx.sym.FullyConnected(body, num_hidden=10, name="new_fc")
    net = mx.sym.SoftmaxOutput(head, name="softmax")
    assert data.name in net.list_arguments()

    def make(**kwargs):
        return MainLoop(
            net,
            digits_iter(X, y),
            arg_params=arg_params,
            aux_params=aux_params,
            extensions=[FinishAfter(after_n_epochs=1)],
            **kwargs,
        )

    with pytest.raises(ValueError, match=r"\['fc2_bias', 'fc2_weight'\].*allow_extra=True"):
        make()
    with caplog.at_level(logging.INFO, logger="mxoid"):
        loop = make(allow_extra=True)
    assert "fc2_bias" in caplog.text and "fc2_weight" in caplog.text
    np.testing.assert_array_equal(
        loop.get_params()[0]["conv1_weight"].asnumpy(), arg_params["conv1_weight"].asnumpy()
    )


def test_a_head_of_another_shape_names_the_parameter_both_shapes_and_the_fix(tmp_path):
    X, y = digits_images(64)
    arg_params, aux_params = load_params(pretrained(tmp_path, epochs=1))
    with pytest.raises(ValueError) as error:
        MainLoop(
            lenet(num_classes=10),
            digits_iter(X, y),
            arg_params=arg_params,
            extensions=[FinishAfter(after_n_epochs=1)],
        )
    message = str(error.value)
    assert "'fc2_weight'" in message and "(5, 32)" in message and "(10, 32)" in message
    assert "'fc2_bias'" in message and "Leave 'fc2_bias', 'fc2_weight' out" in message


# ------------------------------------------------------------------ load_params
def test_load_params_round_trips_module_save_checkpoint(tmp_path):
    X, y = digits_images(64)
    net = lenet()
    module = mx.mod.Module(net, context=mx.cpu(), logger=logging.getLogger("quiet"))
    module.fit(digits_iter(X, y), num_epoch=1, optimizer_params={"learning_rate": 0.1})
    prefix = str(tmp_path / "model")
    module.save_checkpoint(prefix, 1)
    module.save_checkpoint(prefix, 3)
    expected_args, expected_aux = module.get_params()
    for source, epoch in ((prefix, None), (prefix, 1), (f"{prefix}-0003.params", None)):
        arg_params, aux_params = load_params(source, epoch)
        assert arg_params.keys() == expected_args.keys()
        assert aux_params.keys() == expected_aux.keys()
        for name in expected_args:
            np.testing.assert_array_equal(arg_params[name].asnumpy(), expected_args[name].asnumpy())
    with pytest.raises(FileNotFoundError, match="model-0002.params"):
        load_params(prefix, epoch=2)
    with pytest.raises(FileNotFoundError, match="nothing saved at"):
        load_params(str(tmp_path / "elsewhere"))


def test_load_params_reads_an_mxoid_checkpoint_folder_and_directory(tmp_path):
    X, y = digits_images(64)
    loop = MainLoop(
        lenet(),
        digits_iter(X, y),
        extensions=[Checkpoint(tmp_path, every_n_epochs=1), FinishAfter(after_n_epochs=2)],
    ).run()
    final = host(loop.get_params()[0])
    folders = list_checkpoints(str(tmp_path))
    assert len(folders) == 2
    for source, epoch in ((tmp_path, None), (folders[-1], None), (tmp_path, 2)):
        assert host(load_params(source, epoch)[0]).keys() == final.keys()
        for name, value in host(load_params(source, epoch)[0]).items():
            np.testing.assert_array_equal(value, final[name])
    first = host(load_params(tmp_path, epoch=1)[0])
    assert not np.array_equal(first["fc1_weight"], final["fc1_weight"])
    with pytest.raises(FileNotFoundError, match="after epoch 5"):
        load_params(tmp_path, epoch=5)


# ------------------------------------------------------- per-parameter rates
@pytest.mark.parametrize("devices", ["one", "two"])
def test_an_optimizer_instance_with_set_lr_mult_trains_as_in_module_fit(devices):
    X, y = digits_images(128)
    net = lenet()
    args, aux = initial_params(net, (BATCH, 1, 8, 8))

    def optimizer():
        sgd = mx.optimizer.SGD(learning_rate=0.1, momentum=0.9, rescale_grad=1.0 / BATCH)
        sgd.set_lr_mult({"fc1_weight": 0.0, "conv1_weight": 0.1})
        sgd.set_wd_mult({"fc2_weight": 10.0})
        return sgd

    mx.random.seed(7)
    loop = MainLoop(
        net,
        digits_iter(X, y),
        contexts=DEVICES[devices],
        arg_params=args,
        optimizer=optimizer(),
        extensions=[FinishAfter(after_n_epochs=1)],
    ).run()
    mx.random.seed(7)
    module = mx.mod.Module(net, context=DEVICES[devices], logger=logging.getLogger("quiet"))
    module.fit(digits_iter(X, y), num_epoch=1, optimizer=optimizer(), arg_params=args)
    ours, theirs = host(loop.get_params()[0]), host(module.get_params()[0])
    for name in ours:
        np.testing.assert_array_equal(ours[name], theirs[name], err_msg=name)
    np.testing.assert_array_equal(ours["fc1_weight"], args["fc1_weight"].asnumpy())


def attributed_mlp(multipliers=True):
    """An MLP whose Variables carry lr_mult / wd_mult, as users write them for fine-tuning."""
    data = mx.sym.Flatten(mx.sym.Variable("data"))
    if not multipliers:
        hidden = mx.sym.Activation(
            mx.sym.FullyConnected(data, num_hidden=32, name="fc1"), act_type="relu"
        )
        out = mx.sym.FullyConnected(hidden, num_hidden=10, name="fc2")
        return mx.sym.SoftmaxOutput(out, name="softmax")
    slow = mx.sym.Variable("fc1_weight", lr_mult=0.1, wd_mult=2.0)
    hidden = mx.sym.Activation(
        mx.sym.FullyConnected(data, weight=slow, num_hidden=32, name="fc1"), act_type="relu"
    )
    no_decay = mx.sym.Variable("fc2_weight", wd_mult=0.0)
    out = mx.sym.FullyConnected(hidden, weight=no_decay, num_hidden=10, name="fc2")
    return mx.sym.SoftmaxOutput(out, name="softmax")


@pytest.mark.parametrize("devices", ["one", "two"])
def test_symbol_lr_mult_and_wd_mult_attributes_train_as_in_module_fit(devices):
    X, y = digits_images(128)
    net = attributed_mlp()
    args, _ = initial_params(net, (BATCH, 1, 8, 8))
    params = {"learning_rate": 0.1, "momentum": 0.9, "wd": 0.01}
    loop = MainLoop(
        net,
        digits_iter(X, y),
        contexts=DEVICES[devices],
        arg_params=args,
        optimizer_params=dict(params),
        extensions=[FinishAfter(after_n_epochs=2)],
    ).run()
    module = mx.mod.Module(net, context=DEVICES[devices], logger=logging.getLogger("quiet"))
    module.fit(digits_iter(X, y), num_epoch=2, optimizer_params=dict(params), arg_params=args)
    ours, theirs = host(loop.get_params()[0]), host(module.get_params()[0])
    for name in ours:
        np.testing.assert_array_equal(ours[name], theirs[name], err_msg=name)
    # The multipliers made a difference: without them the run ends elsewhere.
    plain = MainLoop(
        attributed_mlp(multipliers=False),
        digits_iter(X, y),
        contexts=DEVICES[devices],
        arg_params=args,
        optimizer_params=dict(params),
        extensions=[FinishAfter(after_n_epochs=2)],
    ).run()
    assert not np.array_equal(host(plain.get_params()[0])["fc1_weight"], ours["fc1_weight"])


def test_an_optimizer_instance_with_another_rescale_grad_gets_modules_warning():
    X, y = digits_images(64)
    net = attributed_mlp()
    with pytest.warns(UserWarning, match=r"rescale_grad is not normalized to 1.0/batch_size"):
        MainLoop(
            net,
            digits_iter(X, y),
            optimizer=mx.optimizer.SGD(learning_rate=0.1),  # rescale_grad 1, not 1/32
            initializer=mx.init.Xavier(),
            extensions=[FinishAfter(after_n_epochs=1)],
        )
