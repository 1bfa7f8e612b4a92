"""The networks people train, small enough for two CPU cores, and real data for them.

Written after MXNet 1.9.1's own example networks
(``example/image-classification/symbols/``): a ResNet with BatchNorm
(``resnet.py``: a BatchNorm on the data with ``fix_gamma=True``, pre-activation
residual units, a final BatchNorm and global pooling), a MobileNet with
depthwise convolutions (``mobilenet.py``: convolution, BatchNorm with
``fix_gamma=True``, ReLU), and a LeNet with Dropout. All take 1x8x8 images:
scikit-learn's digits (shipped with the package, nothing to download).
"""

import mxnet as mx
import numpy as np

BN_MOMENTUM = 0.9
BN_EPS = 2e-5
NETWORKS = ("resnet", "mobilenet", "dropout")


def _residual_unit(data, num_filter, stride, dim_match, name):
    bn1 = mx.sym.BatchNorm(
        data, fix_gamma=False, eps=BN_EPS, momentum=BN_MOMENTUM, name=name + "_bn1"
    )
    act1 = mx.sym.Activation(bn1, act_type="relu", name=name + "_relu1")
    conv1 = mx.sym.Convolution(
        act1,
        num_filter=num_filter,
        kernel=(3, 3),
        stride=stride,
        pad=(1, 1),
        no_bias=True,
        name=name + "_conv1",
    )
    bn2 = mx.sym.BatchNorm(
        conv1, fix_gamma=False, eps=BN_EPS, momentum=BN_MOMENTUM, name=name + "_bn2"
    )
    act2 = mx.sym.Activation(bn2, act_type="relu", name=name + "_relu2")
    conv2 = mx.sym.Convolution(
        act2,
        num_filter=num_filter,
        kernel=(3, 3),
        stride=(1, 1),
        pad=(1, 1),
        no_bias=True,
        name=name + "_conv2",
    )
    if dim_match:
        shortcut = data
    else:
        shortcut = mx.sym.Convolution(
            act1,
            num_filter=num_filter,
            kernel=(1, 1),
            stride=stride,
            no_bias=True,
            name=name + "_sc",
        )
    return conv2 + shortcut


def resnet(num_classes=10, units=(1, 1), filters=(8, 8, 16)):
    """A pre-activation ResNet as resnet.py builds it for small images.

    Stage ``i`` has ``units[i]`` residual units of ``filters[i + 1]`` channels;
    its first unit changes the shape (stride 2 after the first stage) and has
    a projection shortcut. ``units=(3, 3, 3), filters=(16, 16, 32, 64)`` is
    MXNet's ResNet-20.
    """
    data = mx.sym.Variable("data")
    body = mx.sym.BatchNorm(data, fix_gamma=True, eps=BN_EPS, momentum=BN_MOMENTUM, name="bn_data")
    body = mx.sym.Convolution(
        body, num_filter=filters[0], kernel=(3, 3), pad=(1, 1), no_bias=True, name="conv0"
    )
    for stage, count in enumerate(units):
        for unit in range(count):
            stride = (2, 2) if stage > 0 and unit == 0 else (1, 1)
            body = _residual_unit(
                body, filters[stage + 1], stride, unit > 0, f"stage{stage + 1}_unit{unit + 1}"
            )
    body = mx.sym.BatchNorm(body, fix_gamma=False, eps=BN_EPS, momentum=BN_MOMENTUM, name="bn1")
    body = mx.sym.Activation(body, act_type="relu", name="relu1")
    body = mx.sym.Pooling(body, global_pool=True, kernel=(7, 7), pool_type="avg", name="pool1")
    fc = mx.sym.FullyConnected(mx.sym.Flatten(body), num_hidden=num_classes, name="fc1")
    return mx.sym.SoftmaxOutput(fc, name="softmax")


def resnet20(num_classes=10):
    """MXNet's ResNet-20 (``resnet.py`` with ``num_layers=20`` on small images)."""
    return resnet(num_classes, units=(3, 3, 3), filters=(16, 16, 32, 64))


def _conv_bn_relu(data, num_filter, kernel=(1, 1), stride=(1, 1), pad=(0, 0), num_group=1, name=""):
    conv = mx.sym.Convolution(
        data,
        num_filter=num_filter,
        kernel=kernel,
        stride=stride,
        pad=pad,
        num_group=num_group,
        no_bias=True,
        name=name + "_conv",
    )
    bn = mx.sym.BatchNorm(conv, fix_gamma=True, name=name + "_bn")
    return mx.sym.Activation(bn, act_type="relu", name=name + "_relu")


def mobilenet(num_classes=10, width=8):
    """A MobileNet: depthwise (num_group = channels) then pointwise convolutions.

    As in mobilenet.py.
    """
    data = mx.sym.Variable("data")
    body = _conv_bn_relu(data, width, kernel=(3, 3), pad=(1, 1), name="conv1")
    for index, (channels, stride) in enumerate(((width, 1), (2 * width, 2), (2 * width, 1))):
        inputs = width if index == 0 else (width if index == 1 else 2 * width)
        body = _conv_bn_relu(
            body,
            inputs,
            kernel=(3, 3),
            stride=(stride, stride),
            pad=(1, 1),
            num_group=inputs,
            name=f"conv{index + 2}_dw",
        )
        body = _conv_bn_relu(body, channels, name=f"conv{index + 2}_pw")
    body = mx.sym.Pooling(body, global_pool=True, kernel=(4, 4), pool_type="avg", name="pool")
    fc = mx.sym.FullyConnected(mx.sym.Flatten(body), num_hidden=num_classes, name="fc")
    return mx.sym.SoftmaxOutput(fc, name="softmax")


def dropout_lenet(num_classes=10, p=0.5):
    """A LeNet with Dropout before each fully connected layer."""
    data = mx.sym.Variable("data")
    conv = mx.sym.Convolution(data, num_filter=8, kernel=(3, 3), name="conv1")
    act = mx.sym.Activation(conv, act_type="tanh", name="tanh1")
    pool = mx.sym.Pooling(act, pool_type="max", kernel=(2, 2), stride=(2, 2), name="pool1")
    drop1 = mx.sym.Dropout(mx.sym.Flatten(pool, name="flatten"), p=p, name="drop1")
    fc1 = mx.sym.Activation(
        mx.sym.FullyConnected(drop1, num_hidden=32, name="fc1"), act_type="tanh", name="tanh2"
    )
    drop2 = mx.sym.Dropout(fc1, p=p, name="drop2")
    fc2 = mx.sym.FullyConnected(drop2, num_hidden=num_classes, name="fc2")
    return mx.sym.SoftmaxOutput(fc2, name="softmax")


BUILDERS = {"resnet": resnet, "mobilenet": mobilenet, "dropout": dropout_lenet}


def network(name):
    """The network called ``name`` (one of :data:`NETWORKS`)."""
    return BUILDERS[name]()


def digits_images(n=None):
    """scikit-learn's digits as (X float32 [n, 1, 8, 8] in [0, 1], y float32 [n])."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    X = (digits.images / 16.0).astype("float32")[:, None, :, :]
    y = digits.target.astype("float32")
    return (X, y) if n is None else (X[:n], y[:n])


def fix_gamma_names(symbol):
    """The gammas of ``BatchNorm(fix_gamma=True)`` layers: the forward pass ignores them and
    resets them to 1 in place, so any extra forward pass changes their stored value."""
    names = []
    config = symbol.attr_dict()
    for name, attrs in config.items():
        if name.endswith("_gamma"):
            continue
        if (
            attrs.get("fix_gamma", "True") in ("True", "true", "1")
            and f"{name}_gamma" in symbol.list_arguments()
        ):
            names.append(f"{name}_gamma")
    return sorted(names)


def initial_params(symbol, data_shape, seed=1):
    """Xavier-like initial parameters and fresh BatchNorm statistics.

    Drawn with NumPy's ``seed``.
    """
    rng = np.random.RandomState(seed)
    arg_shapes, _, aux_shapes = symbol.infer_shape(data=data_shape)
    args = {}
    for name, shape in zip(symbol.list_arguments(), arg_shapes):
        if name in ("data", "softmax_label"):
            continue
        if name.endswith("_gamma"):
            args[name] = mx.nd.ones(shape)
        elif name.endswith(("_beta", "_bias")):
            args[name] = mx.nd.zeros(shape)
        else:
            fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else shape[0]
            scale = np.sqrt(3.0 / fan_in)
            args[name] = mx.nd.array(rng.uniform(-scale, scale, shape))
    aux = {
        name: (mx.nd.zeros(shape) if name.endswith("moving_mean") else mx.nd.ones(shape))
        for name, shape in zip(symbol.list_auxiliary_states(), aux_shapes)
    }
    return args, aux
