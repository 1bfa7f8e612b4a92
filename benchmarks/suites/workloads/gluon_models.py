"""What the gluon workload trains: its networks as Gluon blocks, their data and first values.

- ``mlp`` and ``lenet``: the symbol workload's networks (MNIST-shaped synthetic data).
- ``jitter``: issue 38's own setting, a 3-layer MLP (64-128-64-10, ReLU) on scikit-learn's
  digits (1,797 samples of 8x8, scaled to [0, 1]) read through a ``DataLoader`` whose
  dataset adds a per-sample NumPy jitter (:func:`jitter`, in the transform, as Gluon
  users augment). The in-memory contenders of that cell read the digits unjittered.
- ``resnet18``: the model zoo's ResNet-18 (``resnet18_v1(thumbnail=True, classes=10)``,
  BatchNorm throughout) on CIFAR-shaped synthetic data (3x32x32, 10 noisy prototypes,
  fixed seed).

Every block's parameters are named without an instance counter (``prefix``), so that the
contenders of a process, each building its own block, share the names of the first values
(:func:`initial_values`).
"""

import math

import mxnet as mx
import numpy as np
from harness.workload import NUM_CLASSES, PARAM_SEED, initial_params, make_data

MODELS = ("mlp", "lenet", "jitter", "resnet18")
SAMPLE_SHAPES = {"mlp": (784,), "lenet": (1, 28, 28), "jitter": (64,), "resnet18": (3, 32, 32)}
JITTER_SCALE = 0.05  # the standard deviation of the jitter, on values in [0, 1]


def jitter(sample: np.ndarray) -> np.ndarray:
    """A random augmentation drawn from NumPy's global generator, per sample."""
    return sample + np.random.normal(0.0, JITTER_SCALE, sample.shape).astype("float32")


def gluon_net(model: str):
    """The cell's network as a Gluon block, its parameters named as the symbol's where the
    symbol workload has the model."""
    nn = mx.gluon.nn
    if model == "resnet18":
        from mxnet.gluon.model_zoo import vision

        return vision.resnet18_v1(thumbnail=True, classes=NUM_CLASSES, prefix="resnet18_")
    net = nn.HybridSequential(prefix="")
    with net.name_scope():
        if model in ("mlp", "jitter"):
            inputs = SAMPLE_SHAPES[model][0]
            net.add(nn.Dense(128, activation="relu", in_units=inputs, prefix="fc1_"))
            net.add(nn.Dense(64, activation="relu", in_units=128, prefix="fc2_"))
            net.add(nn.Dense(10, in_units=64, prefix="fc3_"))
        else:
            net.add(nn.Conv2D(20, 5, activation="tanh", in_channels=1, prefix="conv1_"))
            net.add(nn.MaxPool2D(2, 2))
            net.add(nn.Conv2D(50, 5, activation="tanh", in_channels=20, prefix="conv2_"))
            net.add(nn.MaxPool2D(2, 2))
            net.add(nn.Dense(500, activation="tanh", in_units=800, prefix="fc1_"))
            net.add(nn.Dense(10, in_units=500, prefix="fc2_"))
    return net


def finish_initialization(net, model: str, ctx=None) -> None:
    """Give deferred parameters (a BatchNorm without ``in_channels``) their shapes, as
    Gluon's first forward pass does; in predict mode, so that no statistic moves."""
    if any(p._data is None for p in net.collect_params().values()):
        shape = (1,) + SAMPLE_SHAPES[model]
        with mx.autograd.predict_mode():
            net(mx.nd.zeros(shape, ctx=ctx))


def data(model: str, samples: int, seed: int = 0):
    """The cell's data and labels (NumPy, float32; fixed seeds)."""
    if model in ("mlp", "lenet"):
        return make_data(model, samples, seed)
    if model == "jitter":
        from sklearn.datasets import load_digits

        digits = load_digits()
        X = (digits.data[:samples] / 16.0).astype("float32")
        return X, digits.target[:samples].astype("float32")
    rng = np.random.RandomState(seed)  # CIFAR-shaped: 10 noisy prototypes
    labels = rng.randint(0, NUM_CLASSES, size=samples)
    prototypes = rng.rand(NUM_CLASSES, *SAMPLE_SHAPES[model]).astype("float32")
    images = 0.5 * rng.rand(samples, *SAMPLE_SHAPES[model]).astype("float32")
    images += 0.5 * prototypes[labels]
    return images, labels.astype("float32")


def initial_values(model: str) -> dict:
    """The first values of the cell's network by parameter name: the symbol workload's
    Glorot-uniform draw where it has the model; else the same draw by NumPy (fixed seed,
    sorted names) for weights, and Gluon's ones and zeros for BatchNorm's gamma, running
    variance, beta, running mean and biases. Not MXNet's initializers: on this machine a
    seeded ``mx.init.Xavier()`` drew one of the ResNet's 62 arrays otherwise in one
    process of three, and the processes' results then differed."""
    if model in ("mlp", "lenet"):
        return initial_params(model)
    net = gluon_net(model)
    net.initialize(mx.init.Zero())
    finish_initialization(net, model)
    rng, values = np.random.RandomState(PARAM_SEED), {}
    for name in sorted(net.collect_params().keys()):
        shape = net.collect_params()[name].shape
        if name.endswith(("_gamma", "_running_var")):
            values[name] = np.ones(shape, np.float32)
        elif not name.endswith("_weight"):
            values[name] = np.zeros(shape, np.float32)
        else:
            receptive = int(np.prod(shape[2:])) if len(shape) > 2 else 1
            bound = math.sqrt(6.0 / ((shape[1] + shape[0]) * receptive))
            values[name] = rng.uniform(-bound, bound, shape).astype(np.float32)
    return values
