"""The precision suite: mxoid training in bfloat16 (mixed_precision='bfloat16') against float32.

LeNet and a CIFAR ResNet-20 (symbols), and the model zoo's ResNet-18 thumbnail (a Gluon
block, ``resnet18_v1(thumbnail=True, classes=10)``), on MNIST (``MXOID_MNIST_DIR``, or
``/work/shared/data/mnist``; synthetic MNIST-shaped data where absent, said in the
report), batch 64, one CPU context, SGD with momentum, the same initial parameters. The
two loops of a model train in turns in one process, an epoch each per round (round 0:
binding and the warm-up, untimed), the order drawn per pair of rounds
(``harness.turns``): the speed ratio is bfloat16's throughput over float32's round by
round, its median and 90% interval. Then each loop's accuracy on held-out test images
(the same for both), after the same epochs. ``--check``: LeNet alone, tiny; mxoid's
bfloat16 parameters equal ``Module.fit`` of AMP's converted symbol
(``amp.convert_symbol(..., data_names=...)``), they and float32's are float32 and finite.
A CPU without bfloat16 (see ``mxoid.precision``) is reported, not measured.
"""

import gzip
import os
import sys
import tempfile
from typing import Dict, List, Optional, Sequence

import mxnet as mx
import numpy as np
from harness import report, stats, turns, workload

MNIST = ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz")
MNIST_TEST = ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")
MNIST_DEFAULT = "/work/shared/data/mnist"
BATCH, TEST_SAMPLES = 64, 2000
OPTIMIZER_PARAMS = {"learning_rate": 0.05, "momentum": 0.9, "wd": 1e-4}
PRECISIONS = ("float32", "bfloat16")
# model -> training samples an epoch, per mode; rounds (epochs, the first untimed) per mode
MODES = {
    "full": ({"lenet": 12000, "resnet20": 4000, "resnet18": 1536}, 9),
    "quick": ({"lenet": 3000, "resnet20": 640, "resnet18": 256}, 4),
    "check": ({"lenet": 256}, 2),
}


def read_idx(path: str) -> np.ndarray:
    with gzip.open(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = tuple(int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(dims))
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def mnist(samples: int):
    """((X, y) to train, (X, y) held out, source): MNIST where found, else synthetic."""
    folder = os.environ.get("MXOID_MNIST_DIR") or MNIST_DEFAULT
    if all(os.path.isfile(os.path.join(folder, n)) for n in MNIST + MNIST_TEST):
        arrays = []
        for images, labels in (MNIST, MNIST_TEST):
            X = read_idx(os.path.join(folder, images))[:, None].astype(np.float32) / 255
            arrays.append((X, read_idx(os.path.join(folder, labels)).astype(np.float32)))
        (X, y), (Xt, yt) = arrays
        return (X[:samples], y[:samples]), (Xt[:TEST_SAMPLES], yt[:TEST_SAMPLES]), folder
    X, y = workload.make_data("lenet", samples + TEST_SAMPLES)
    return (X[:samples], y[:samples]), (X[samples:], y[samples:]), "synthetic"


def network(model: str):
    """(network, MainLoop keywords) of a model: a symbol, or a Gluon block and its loss."""
    if model == "lenet":
        return workload.build_symbol("lenet"), {}
    if model == "resnet20":
        return workload.cifar_resnet(3), {}
    from mxnet import gluon

    net = gluon.model_zoo.vision.resnet18_v1(thumbnail=True, classes=10)
    net.initialize(mx.init.Xavier())
    return net, {"loss": gluon.loss.SoftmaxCrossEntropyLoss()}


def contender(model: str, precision: str, test, found: Dict[str, dict], seed: int = 1):
    """The training function of a player (``harness.turns.Player``): a MainLoop, its
    accuracy on ``test`` written to ``found[precision]`` once trained."""

    def train(spec, iterator, init, clock):
        from mxoid import FinishAfter, MainLoop

        mx.random.seed(seed)  # the same initial values for both (the players build in turn)
        net, options = network(model)
        if model == "lenet":
            options["arg_params"] = {k: mx.nd.array(v) for k, v in init.items()}
        else:
            options.setdefault("initializer", mx.init.Xavier())
        stop = FinishAfter(after_n_epochs=spec["epochs"])
        loop = MainLoop(
            net,
            iterator,
            optimizer_params=dict(OPTIMIZER_PARAMS),
            extensions=[stop, workload.clock_extension(clock)],
            mixed_precision=None if precision == "float32" else precision,
            **options,
        )
        loop.run()
        valid = mx.io.NDArrayIter(*test, BATCH, label_name="softmax_label")
        metric = {"output": "acc"} if "loss" in options else "acc"
        accuracy = loop.score(valid, metric)["valid_accuracy"]
        params = {k: v.asnumpy() for k, v in loop.get_params()[0].items()}
        graph = loop.symbol.tojson(remove_amp_cast=False)
        found[precision] = {"accuracy": float(accuracy), "amp_cast": "amp_cast" in graph}
        found[precision]["float32"] = all(v.dtype == np.float32 for v in params.values())
        return params

    return train


def module_fit_amp(X, y, init: dict, epochs: int) -> Dict[str, np.ndarray]:
    """MXNet's own bfloat16 training of LeNet: Module.fit of AMP's converted symbol."""
    import logging

    from mxnet.contrib import amp

    symbol = amp.convert_symbol(
        workload.build_symbol("lenet"), "bfloat16", data_names=["data", "softmax_label"]
    )
    module = mx.mod.Module(symbol, context=mx.cpu(), logger=logging.getLogger("quiet"))
    module.fit(
        mx.io.NDArrayIter(X, y, BATCH, shuffle=False, label_name="softmax_label"),
        num_epoch=epochs,
        optimizer="sgd",
        optimizer_params=dict(OPTIMIZER_PARAMS),
        arg_params={k: mx.nd.array(v) for k, v in init.items()},
    )
    mx.nd.waitall()
    return {k: v.asnumpy() for k, v in module.get_params()[0].items()}


def measure(
    model: str, samples: int, rounds: int, workdir: str, failures: List[str], seed: int = 1
) -> dict:
    """One model: float32 and bfloat16 in turns; throughput, the ratio, the accuracies."""
    (X, y), test, source = mnist(samples)
    init = workload.initial_params("lenet") if model == "lenet" else {}
    spec = {"batch_size": BATCH, "workdir": workdir, "epochs": rounds}
    found: Dict[str, dict] = {}
    players = {
        p: turns.Player(p, spec, X, y, init, contender(model, p, test, found, seed))
        for p in PRECISIONS
    }
    turns.play_rounds(players, rounds)
    row: Dict[str, object] = {"model": model, "samples_per_epoch": samples, "data": source}
    results = {}
    for precision, player in players.items():
        result = player.result()
        if result["error"]:
            failures.append(f"{model} {precision}: {result['error'].strip().splitlines()[-1]}")
            return row
        seconds = np.asarray(result["epoch_seconds"], np.float64)
        rates = samples / seconds
        results[precision] = {**result, "epoch_seconds": [result["epoch_seconds"]]}
        row[precision] = {
            "samples_per_second": float(np.median(rates)),
            "epoch_seconds": seconds.tolist(),
            **found.get(precision, {}),
        }
        if not result["finite"] or not found.get(precision, {}).get("float32"):
            failures.append(f"{model} {precision}: parameters not finite float32")
    estimate, interval = stats.paired_ratio(results["bfloat16"], results["float32"])
    row.update(speed_ratio=estimate, speed_ratio_interval=list(interval))
    if not row["bfloat16"].get("amp_cast"):
        failures.append(f"{model}: the bfloat16 loop's graph has no amp_cast")
    row["accuracy_difference"] = row["bfloat16"]["accuracy"] - row["float32"]["accuracy"]
    if model == "lenet" and players["bfloat16"].params is not None and len(X) <= 512:
        theirs = module_fit_amp(X, y, init, rounds)
        ours = players["bfloat16"].params
        if any(not np.array_equal(ours[k], theirs[k]) for k in theirs):
            failures.append("lenet bfloat16: parameters differ from Module.fit of AMP's symbol")
        row["equal_to_module_fit_amp"] = not failures
    return row


COLUMNS = (
    ("model", "{model}"),
    ("data", "{data_name}"),
    ("float32 samples/s", "{float32[samples_per_second]:,.0f}"),
    ("bfloat16 samples/s", "{bfloat16[samples_per_second]:,.0f}"),
    ("speed bf16 / fp32 (90%)", "{speed_ratio:.2f} ({speed_ratio_interval[0]:.2f}-{high:.2f})"),
    ("accuracy float32", "{float32[accuracy]:.4f}"),
    ("accuracy bfloat16", "{bfloat16[accuracy]:.4f}"),
)


def table(rows: Sequence[dict]) -> str:
    entries = [
        {**r, "high": r["speed_ratio_interval"][1], "data_name": os.path.basename(r["data"])}
        for r in rows
        if "speed_ratio" in r
    ]
    return report.table_of(COLUMNS, entries, "llrrrrr")


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = report.parser(__doc__, "precision")
    parser.add_argument("--models", help="comma-separated: lenet,resnet20,resnet18")
    parser.add_argument(
        "--seed", type=int, default=1, help="MXNet's seed: the ResNets' initial values"
    )
    args = parser.parse_args(argv)
    run = report.Run("precision", args, argv)
    sizes, rounds = MODES[run.mode]
    models = args.models.split(",") if args.models else list(sizes)
    from mxoid.precision import bfloat16_support, cpu_flags

    missing = bfloat16_support()
    if missing is not None:
        flags = ", ".join(cpu_flags())
        print(f"this CPU does not compute bfloat16 ({missing}; flags {flags}): nothing measured")
        return run.finish([], {"models": models}, [], bfloat16=missing)
    failures: List[str] = []
    rows = []
    with tempfile.TemporaryDirectory() as workdir:
        for model in models:
            samples = sizes.get(model, MODES["quick"][0][model])
            print(f"{model}: {samples} samples an epoch, {rounds} rounds", flush=True)
            rows.append(measure(model, samples, rounds, workdir, failures, args.seed))
    print(table(rows))
    settings = {"models": models, "rounds": rounds, "batch_size": BATCH, "contexts": 1}
    settings["seed"] = args.seed
    settings.update(optimizer_params=OPTIMIZER_PARAMS, cpu_flags=cpu_flags())
    return run.finish(failures, settings, rows)
