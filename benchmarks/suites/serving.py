"""The serving suite: MXNet float32, MXNet int8 and onnxruntime on the exported model.

For an MLP (784-128-64-10), LeNet and a ResNet-20 (the CIFAR one, on 1x28x28 images),
each trained by MainLoop on real data (MNIST from ``MXOID_MNIST_DIR`` or
``../shared/data/mnist`` beside the checkout; else scikit-learn's digits, upsampled
to 28x28), then exported with ``mxoid.export_onnx`` and quantized with
``mxoid.quantize`` (naive calibration, 10 batches of training images): the latency of
one forward pass from a NumPy batch to a NumPy output, at batch 1 and 32, and the
throughput it implies, of three contenders on one thread each (MXNet's engine and
OpenMP, onnxruntime's intra- and inter-op pools): ``mxnet_fp32`` (the prediction graph
bound once, as Predictor binds it), ``mxnet_int8`` (the quantized graph, likewise) and
``onnxruntime`` (an ``InferenceSession`` of the ONNX file). Each round times every
contender in an order drawn per pair of rounds (round 0 warms up); ratios to float32
round by round, with 90% bootstrap intervals. The accuracy of each on the held-out
images. ``--check``: onnxruntime within 1e-5 of float32 on the held-out images, int8
within 5% of its accuracy.
"""

import os
import sys
import tempfile
import time
from typing import Dict, List, Optional, Sequence

import mxnet as mx
import numpy as np
from harness import env, report, stats, turns, workload

import mxoid
from mxoid.export.sources import prediction_graphs

MODELS = ("mlp", "lenet", "resnet20")
BATCHES = (1, 32)
KINDS = ("mxnet_fp32", "mxnet_int8", "onnxruntime")
# mode: (training samples, held-out samples, epochs {model: n}, rounds, seconds a turn)
MODES = {
    "full": (20000, 10000, {"mlp": 3, "lenet": 2, "resnet20": 1}, 15, 0.25),
    "quick": (6000, 2000, {"mlp": 2, "lenet": 1, "resnet20": 1}, 7, 0.1),
    "check": (640, 256, {"mlp": 1, "lenet": 1, "resnet20": 1}, 2, 0.01),
}
ONNX_ATOL, INT8_DROP = 1e-5, 0.05  # --check: the ONNX outputs, int8's accuracy


def images(mode: str):
    """``(X_train, y_train, X_test, y_test, source)``: MNIST where it lies, else the digits."""
    train_n, test_n = MODES[mode][:2]
    folder = os.environ.get("MXOID_MNIST_DIR") or os.path.join(
        os.path.dirname(env.ROOT), "shared", "data", "mnist"
    )
    if mode != "check" and os.path.isfile(os.path.join(folder, "t10k-images-idx3-ubyte.gz")):
        sys.path.insert(0, os.path.join(env.ROOT, "examples"))
        from common import read_mnist

        splits = read_mnist(folder)
        (X, y), (Xt, yt) = splits["train"], splits["test"]
        return X[:train_n], y[:train_n], Xt[:test_n], yt[:test_n], f"MNIST ({folder})"
    from sklearn.datasets import load_digits

    digits = load_digits()
    rows = np.minimum((np.arange(28) * 8) // 28, 7)  # nearest-neighbour 8x8 -> 28x28
    X = (digits.images[:, rows][:, :, rows] / 16.0).astype("float32")[:, None]
    y = digits.target.astype("float32")
    rng = np.random.RandomState(0)
    order = rng.permutation(len(X))
    X, y, test = X[order], y[order], min(test_n, len(X) // 4)
    return X[test:][:train_n], y[test:][:train_n], X[:test], y[:test], "scikit-learn digits"


def network(model: str) -> mx.sym.Symbol:
    return workload.cifar_resnet(3) if model == "resnet20" else workload.build_symbol(model)


def train(model: str, X, y, epochs: int):
    """A MainLoop trained ``epochs`` epochs (SGD with momentum), and its iterator."""
    mx.random.seed(0)
    np.random.seed(0)
    data = X.reshape(len(X), -1) if model == "mlp" else X
    iterator = mx.io.NDArrayIter(data, y, 32, shuffle=True, label_name="softmax_label")
    settings = {"learning_rate": 0.1 if model == "resnet20" else 0.05, "momentum": 0.9}
    loop = mxoid.MainLoop(
        network(model),
        iterator,
        initializer=mx.init.Xavier(magnitude=2),
        optimizer_params={**settings, "wd": 1e-4},
        extensions=[mxoid.FinishAfter(after_n_epochs=epochs)],
    )
    loop.run()
    return loop, iterator


class Contender:
    """One way of serving: ``run(batch)`` is one forward pass, NumPy in, NumPy out."""

    def __init__(self, kind: str, symbol=None, params=None, session=None) -> None:
        self.kind, self.symbol, self.params, self.session = kind, symbol, params, session
        self.executors: Dict[tuple, mx.executor.Executor] = {}

    def run(self, batch: np.ndarray) -> np.ndarray:
        if self.session is not None:
            return self.session.run(None, {"data": batch})[0]
        executor = self.executors.get(batch.shape)
        if executor is None:
            args, aux = self.params
            types = {name: value.dtype for name, value in args.items()}  # int8 weights
            types["data"] = batch.dtype
            executor = self.symbol.simple_bind(
                mx.cpu(), grad_req="null", type_dict=types, data=batch.shape
            )
            for name, array in executor.arg_dict.items():
                if name in args:
                    array[:] = args[name]
            for name, array in executor.aux_dict.items():
                array[:] = aux[name]
            self.executors[batch.shape] = executor
        executor.arg_dict["data"][:] = batch
        return executor.forward(is_train=False)[0].asnumpy()


def contenders(loop, iterator, folder: str) -> Dict[str, Contender]:
    import onnxruntime

    [graph] = prediction_graphs(loop)
    fp32 = Contender("mxnet_fp32", graph.symbol, (graph.params, graph.aux_params))
    int8 = mxoid.quantize(loop, iterator, num_batches=10)
    quantized = Contender("mxnet_int8", int8.symbol, (int8.arg_params, int8.aux_params))
    [exported] = mxoid.export_onnx(loop, os.path.join(folder, "model.onnx"))
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1  # as MXNet's one thread
    session = onnxruntime.InferenceSession(
        exported.path, options, providers=["CPUExecutionProvider"]
    )
    made = {
        "mxnet_fp32": fp32,
        "mxnet_int8": quantized,
        "onnxruntime": Contender("onnxruntime", session=session),
    }
    made["onnxruntime"].export = exported
    made["mxnet_int8"].quantized = int8
    return made


def predictions(contender: Contender, X: np.ndarray) -> np.ndarray:
    return np.concatenate(
        [contender.run(X[i : i + 32]) for i in range(0, len(X) - len(X) % 32, 32)]
    )


def time_calls(contender: Contender, batch: np.ndarray, seconds: float) -> float:
    """Seconds per call: as many calls as fit in ``seconds`` (at least 3), their mean."""
    calls, started = 0, time.perf_counter()
    while calls < 3 or time.perf_counter() - started < seconds:
        contender.run(batch)
        calls += 1
    return (time.perf_counter() - started) / calls


def measure(made: Dict[str, Contender], X: np.ndarray, batch: int, rounds: int, seconds: float):
    data = X[:batch]
    per_round = turns.interleave(
        lambda kind: time_calls(made[kind], data, seconds), KINDS, rounds + 1, turns.shuffled
    )
    entry = {}
    for kind, times in per_round.items():
        timed = np.asarray(times[1:])  # round 0: warm-up
        median = float(np.median(timed))
        entry[kind] = {
            "latency_ms": median * 1e3,
            "latency_ms_rounds": (timed * 1e3).tolist(),
            "samples_per_second": batch / median,
        }
        if kind != "mxnet_fp32":
            ratios = np.asarray(per_round["mxnet_fp32"][1:]) / timed  # speed over float32
            entry[kind]["speed_over_fp32"] = float(np.median(ratios))
            entry[kind]["speed_over_fp32_interval"] = stats.middle(stats.two_stage([ratios]))
    return entry


def evaluate(model: str, X, y, Xt, yt, epochs: int, rounds: int, seconds: float, folder: str):
    loop, iterator = train(model, X, y, epochs)
    made = contenders(loop, iterator, folder)
    test = Xt.reshape(len(Xt), -1) if model == "mlp" else Xt
    kept = len(test) - len(test) % 32
    outputs = {kind: predictions(c, test) for kind, c in made.items()}
    result = {"model": model, "epochs": epochs, "held_out": kept}
    result["accuracy"] = {k: float((o.argmax(1) == yt[:kept]).mean()) for k, o in outputs.items()}
    result["onnx_max_difference"] = float(
        np.abs(outputs["onnxruntime"] - outputs["mxnet_fp32"]).max()
    )
    result["onnx_export_check"] = made["onnxruntime"].export.max_difference
    result["int8_agreement"] = float(
        (outputs["mxnet_int8"].argmax(1) == outputs["mxnet_fp32"].argmax(1)).mean()
    )
    int8 = made["mxnet_int8"].quantized
    result.update(int8_layers=int8.quantized_layers, int8_seconds=int8.seconds)
    result["batches"] = {str(b): measure(made, test, b, rounds, seconds) for b in BATCHES}
    return result


def check(result: dict) -> List[str]:
    failures, model = [], result["model"]
    if not result["onnx_max_difference"] <= ONNX_ATOL:
        failures.append(f"{model}: onnxruntime differs by {result['onnx_max_difference']:.3g}")
    accuracy = result["accuracy"]
    if accuracy["mxnet_int8"] < accuracy["mxnet_fp32"] - INT8_DROP:
        int8, fp32 = accuracy["mxnet_int8"], accuracy["mxnet_fp32"]
        failures.append(f"{model}: int8 accuracy {int8:.4f}, float32 {fp32:.4f}")
    return failures


def table(results: Sequence[dict]) -> str:
    rows = []
    for r in results:
        for batch in BATCHES:
            cells = r["batches"][str(batch)]
            row = [r["model"], str(batch)]
            for kind in KINDS:
                c = cells[kind]
                text = f"{c['latency_ms']:.3f} ms, {c['samples_per_second']:,.0f}/s"
                if "speed_over_fp32" in c:
                    low, high = c["speed_over_fp32_interval"]
                    text += f" ({c['speed_over_fp32']:.2f}x, {low:.2f}-{high:.2f})"
                row.append(text)
            row.append(" / ".join(f"{r['accuracy'][k]:.4f}" for k in KINDS))
            rows.append(row)
    header = [
        "model",
        "batch",
        "MXNet float32",
        "MXNet int8 (x float32)",
        "onnxruntime (x float32)",
        "accuracy fp32 / int8 / ort",
    ]
    return report.markdown_table(header, rows, "lrrrrl")


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = report.parser(__doc__, "serving")
    parser.add_argument("--models", default=",".join(MODELS), help="default: mlp,lenet,resnet20")
    args = parser.parse_args(argv)
    run = report.Run("serving", args, argv)
    train_n, test_n, epochs, rounds, seconds = MODES[run.mode]
    X, y, Xt, yt, source = images(run.mode)
    load_before = os.getloadavg()
    results, failures = [], []
    with tempfile.TemporaryDirectory() as folder:
        for model in args.models.split(","):
            result = evaluate(model, X, y, Xt, yt, epochs[model], rounds, seconds, folder)
            failures += check(result)
            results.append(result)
    held_out = results[0]["held_out"]
    print(f"\n{run.mode} run on {source}: {len(X)} training and {held_out} held-out images;")
    print(
        f"latency of one forward pass (median of {rounds} rounds), throughput, speed over float32:"
    )
    print(table(results))
    settings = {
        "data": source,
        "training_samples": len(X),
        "rounds": rounds,
        "seconds_a_turn": seconds,
    }
    settings.update(threads=1, load_average_before=load_before, load_average_after=os.getloadavg())
    return run.finish(failures, settings, results)
