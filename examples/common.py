"""Code the examples share: networks, data readers, contexts and seeds.

Not part of mxoid: a small module beside the example scripts, which import
it as ``common`` (Python puts a script's own folder first on ``sys.path``).
"""

from __future__ import annotations

import argparse
import copy
import gzip
import os
import random
import shutil
from typing import Dict, List, Sequence, Tuple

# MXNet prints "Subgraph backend MKLDNN is activated" at every bind: a notice about its
# CPU backend that says nothing about training. Set before MXNet is imported (each example
# imports this module first); an explicit MXNET_SUBGRAPH_VERBOSE=1 still shows it.
os.environ.setdefault("MXNET_SUBGRAPH_VERBOSE", "0")

import mxnet as mx
import numpy as np

__all__ = [
    "EXAMPLES_EXTRA",
    "HelpFormatter",
    "MNIST_FILES",
    "add_common_arguments",
    "digits_splits",
    "fresh_output",
    "iterator",
    "lenet",
    "mlp",
    "network",
    "parse_contexts",
    "read_idx",
    "read_mnist",
    "seed_everything",
]

EXAMPLES_EXTRA = (
    "this example needs scikit-learn (for its bundled digits data set); "
    "install it with: pip install 'mxoid[examples]' (or: pip install scikit-learn)"
)

MNIST_FILES = {
    "train_images": "train-images-idx3-ubyte.gz",
    "train_labels": "train-labels-idx1-ubyte.gz",
    "test_images": "t10k-images-idx3-ubyte.gz",
    "test_labels": "t10k-labels-idx1-ubyte.gz",
}

Arrays = Tuple[np.ndarray, np.ndarray]


# --------------------------------------------------------------- arguments
class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """``--help`` with each option's default, once: not where the help says it, nor None."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if not _shows_default(action) or "(default:" in (action.help or ""):
            return action.help or ""
        return super()._get_help_string(action) or ""

    def _format_action(self, action: argparse.Action) -> str:
        # argparse prints no help line, so no default, for an option without help text.
        if not action.help and action.option_strings and _shows_default(action):
            action = copy.copy(action)
            action.help = "(default: %(default)s)"
        return super()._format_action(action)


def _shows_default(action: argparse.Action) -> bool:
    """Whether ``--help`` says the option's default: not for none, an empty one or a flag."""
    default = action.default
    return default is not argparse.SUPPRESS and default not in (None, "") and default is not False


def parse_contexts(text: str) -> List[mx.Context]:
    """Turn ``'cpu:0,cpu:1'`` (or ``'gpu:0'``, ``'cpu'``) into a list of contexts."""
    contexts = []
    for item in text.split(","):
        kind, _, index = item.strip().partition(":")
        if kind not in ("cpu", "gpu") or (index and not index.isdigit()):
            raise argparse.ArgumentTypeError(
                f"bad context {item!r}: write them as cpu:0,cpu:1 (or gpu:0,gpu:1)"
            )
        contexts.append(mx.Context(kind, int(index or 0)))
    return contexts


def add_common_arguments(
    parser: argparse.ArgumentParser,
    *,
    epochs: int,
    batch_size: int,
    learning_rate: float,
    output_dir: str,
) -> None:
    """Add the flags every example has: contexts, epochs, batch size, rate, seed, output."""
    parser.add_argument(
        "--contexts",
        type=parse_contexts,
        default="cpu:0",  # a string default goes through parse_contexts too
        metavar="CTX,CTX",
        help="devices, e.g. cpu:0,cpu:1 (default: %(default)s)",
    )
    parser.add_argument(
        "--epochs", type=int, default=epochs, help="at most this many epochs (default: %(default)s)"
    )
    parser.add_argument(
        "--batch-size",
        type=int,
        default=batch_size,
        help="batch size, split across the contexts (default: %(default)s)",
    )
    parser.add_argument(
        "--learning-rate",
        type=float,
        default=learning_rate,
        help="SGD learning rate, momentum 0.9 (default: %(default)s)",
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of every random generator (default: %(default)s)"
    )
    parser.add_argument(
        "--output-dir",
        default=output_dir,
        help="where the log and checkpoints go (default: %(default)s)",
    )


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and MXNet's generators (parameter init, shuffling, dropout)."""
    random.seed(seed)
    np.random.seed(seed)
    mx.random.seed(seed)


def fresh_output(directory: str, resume: bool) -> Dict[str, str]:
    """Create ``directory`` and return the paths of its log and checkpoint folder.

    Unless ``resume``, what a previous run left there (log and checkpoints)
    is removed first, so that each run of an example starts clean.
    """
    paths = {
        "log": os.path.join(directory, "log.jsonl"),
        "checkpoints": os.path.join(directory, "checkpoints"),
    }
    if not resume:
        if os.path.exists(paths["log"]):
            os.remove(paths["log"])
        shutil.rmtree(paths["checkpoints"], ignore_errors=True)
    os.makedirs(directory, exist_ok=True)
    return paths


# ---------------------------------------------------------------- networks
def lenet(
    num_classes: int = 10,
    channels: Sequence[int] = (20, 50),
    hidden: int = 500,
    kernel: int = 5,
    dropout: float = 0.0,
) -> mx.sym.Symbol:
    """LeNet: two convolution + max-pooling stages, a hidden layer, a softmax named 'softmax'.

    ``kernel=5`` with no padding is LeCun's LeNet for 28x28 images; smaller
    images (the 8x8 digits) use ``kernel=3``, padded so that the size is kept.
    """
    net = mx.sym.Variable("data")
    pad = (0, 0) if kernel == 5 else (kernel // 2, kernel // 2)
    for stage, num_filter in enumerate(channels, start=1):
        net = mx.sym.Convolution(
            net, kernel=(kernel, kernel), pad=pad, num_filter=num_filter, name=f"conv{stage}"
        )
        net = mx.sym.Activation(net, act_type="relu", name=f"relu{stage}")
        net = mx.sym.Pooling(
            net, pool_type="max", kernel=(2, 2), stride=(2, 2), name=f"pool{stage}"
        )
    net = mx.sym.Flatten(net)
    net = mx.sym.Activation(
        mx.sym.FullyConnected(net, num_hidden=hidden, name="fc1"), act_type="relu", name="relu_fc1"
    )
    if dropout:
        net = mx.sym.Dropout(net, p=dropout)
    net = mx.sym.FullyConnected(net, num_hidden=num_classes, name="fc2")
    return mx.sym.SoftmaxOutput(net, name="softmax")


def mlp(num_classes: int = 10, hidden: Sequence[int] = (128, 64)) -> mx.sym.Symbol:
    """A multi-layer perceptron with ReLU layers and a softmax named 'softmax'."""
    net = mx.sym.Flatten(mx.sym.Variable("data"))
    for layer, num_hidden in enumerate(hidden, start=1):
        net = mx.sym.FullyConnected(net, num_hidden=num_hidden, name=f"fc{layer}")
        net = mx.sym.Activation(net, act_type="relu", name=f"relu{layer}")
    net = mx.sym.FullyConnected(net, num_hidden=num_classes, name=f"fc{len(hidden) + 1}")
    return mx.sym.SoftmaxOutput(net, name="softmax")


def network(name: str, image_size: int) -> mx.sym.Symbol:
    """The network an example's ``--network`` names, sized for square images of ``image_size``."""
    if name == "mlp":
        return mlp()
    if image_size <= 8:
        return lenet(channels=(16, 32), hidden=64, kernel=3)
    return lenet()


# -------------------------------------------------------------------- data
def digits_splits(seed: int = 0, valid: float = 0.15, test: float = 0.15) -> Dict[str, Arrays]:
    """scikit-learn's bundled digits (1,797 8x8 images): train, valid and test splits.

    Images are ``float32 [n, 1, 8, 8]`` scaled to [0, 1], labels ``float32 [n]``.
    The splits are stratified by digit and drawn with ``seed``.

    Raises
    ------
    SystemExit
        With :data:`EXAMPLES_EXTRA` when scikit-learn is not installed.
    """
    try:
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split
    except ImportError as error:
        raise SystemExit(f"error: {EXAMPLES_EXTRA}") from error
    digits = load_digits()
    images = (digits.images / 16.0).astype("float32")[:, None, :, :]
    labels = digits.target.astype("float32")
    rest_x, test_x, rest_y, test_y = train_test_split(
        images, labels, test_size=test, stratify=labels, random_state=seed
    )
    train_x, valid_x, train_y, valid_y = train_test_split(
        rest_x, rest_y, test_size=valid / (1 - test), stratify=rest_y, random_state=seed
    )
    return {"train": (train_x, train_y), "valid": (valid_x, valid_y), "test": (test_x, test_y)}


def read_idx(path: str) -> np.ndarray:
    """Read a gzip-compressed IDX file (MNIST's format) into a uint8 array.

    The header is two zero bytes, a type code (0x08 for unsigned bytes), the
    number of dimensions, then each dimension as a big-endian 32-bit integer.
    """
    with gzip.open(path, "rb") as f:
        data = f.read()
    if len(data) < 4 or data[:2] != b"\x00\x00" or data[2] != 0x08:
        raise SystemExit(f"error: {path} is not an IDX file of unsigned bytes (bad header)")
    dims = data[3]
    shape = tuple(int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(dims))
    array = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims)
    if array.size != int(np.prod(shape)):
        raise SystemExit(f"error: {path} holds {array.size} values, its header says {shape}")
    return array.reshape(shape)


def read_mnist(data_dir: str) -> Dict[str, Arrays]:
    """Read the four MNIST files in ``data_dir``: train and test splits.

    Images are ``float32 [n, 1, 28, 28]`` scaled to [0, 1], labels ``float32 [n]``.

    Raises
    ------
    SystemExit
        Naming every missing file, when ``data_dir`` does not hold all four.
    """
    missing = [
        name for name in MNIST_FILES.values() if not os.path.isfile(os.path.join(data_dir, name))
    ]
    if missing:
        where = (
            f"{data_dir} does not exist"
            if not os.path.isdir(data_dir)
            else f"{data_dir} lacks {', '.join(missing)}"
        )
        raise SystemExit(
            f"error: --data-dir must be a folder holding the four MNIST files "
            f"{', '.join(MNIST_FILES.values())}; {where}"
        )
    arrays = {key: read_idx(os.path.join(data_dir, name)) for key, name in MNIST_FILES.items()}
    splits = {}
    for split in ("train", "test"):
        images, labels = arrays[f"{split}_images"], arrays[f"{split}_labels"]
        if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
            raise SystemExit(
                f"error: {data_dir}: the {split} images {images.shape} and labels "
                f"{labels.shape} do not match"
            )
        splits[split] = (
            (images[:, None, :, :] / np.float32(255)).astype("float32"),
            labels.astype("float32"),
        )
    return splits


def iterator(arrays: Arrays, batch_size: int, shuffle: bool = False) -> mx.io.NDArrayIter:
    """An NDArrayIter over ``(images, labels)`` with the label named 'softmax_label'."""
    images, labels = arrays
    return mx.io.NDArrayIter(
        images, labels, batch_size=batch_size, shuffle=shuffle, label_name="softmax_label"
    )
