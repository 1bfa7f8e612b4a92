"""mxoid.export_onnx: what onnxruntime computes from the exported file is what MXNet predicts.

Every check compares onnxruntime's outputs with MXNet's own (``loop.predict``,
``Module.predict``), on the same inputs, at two batch sizes; the networks are
trained a few batches by MainLoop on one and two devices (BatchNorm statistics
averaged over the devices, as ``get_params`` gives them).
"""

import os

import mxnet as mx
import numpy as np
import pytest
from buckets import BATCH, bucket_iter, sym_gen_of
from networks import digits_images, dropout_lenet, resnet20

from mxoid import Checkpoint, FinishAfter, MainLoop, TrainingMonitoring
from mxoid.cli import main as mxoid_command

onnx = pytest.importorskip(
    "onnx", reason="exporting to ONNX needs onnx (below 1.19): pip install 'mxoid[onnx]'"
)
onnxruntime = pytest.importorskip(
    "onnxruntime", reason="checking ONNX files needs onnxruntime: pip install 'mxoid[onnx]'"
)
if not hasattr(onnx, "mapping"):  # pragma: no cover
    pytest.skip(
        f"onnx {onnx.__version__} has no onnx.mapping, which MXNet 1.9.1's exporter needs: "
        "pip install 'onnx<1.19'",
        allow_module_level=True,
    )

from mxoid.export import OnnxExportError, export_onnx  # noqa: E402

X, Y = digits_images()
TOLERANCE = 1e-5
SIZES = (1, 13)  # two batch sizes, neither the training batch's (32)


def digits_mlp():
    data = mx.sym.flatten(mx.sym.Variable("data"))
    hidden = mx.sym.Activation(mx.sym.FullyConnected(data, num_hidden=32, name="fc1"), "relu")
    return mx.sym.SoftmaxOutput(
        mx.sym.FullyConnected(hidden, num_hidden=10, name="fc2"), name="softmax"
    )


NETWORKS = {"mlp": digits_mlp, "lenet": dropout_lenet, "resnet20": resnet20}


def run_onnx(path, inputs, outputs=None):
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1  # no pool of spinning threads beside the other tests
    session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return session.run(outputs, inputs)


@pytest.fixture(
    scope="module",
    params=[(name, devices) for name in NETWORKS for devices in (1, 2)],
    ids=lambda p: f"{p[0]}-{p[1]}dev",
)
def trained(request, tmp_path_factory):
    """A network trained 6 batches by MainLoop, which checkpointed it at the end."""
    name, devices = request.param
    mx.random.seed(0)
    np.random.seed(0)
    folder = tmp_path_factory.mktemp(f"{name}-{devices}")
    train = mx.io.NDArrayIter(X[:192], Y[:192], batch_size=32, label_name="softmax_label")
    loop = MainLoop(
        NETWORKS[name](),
        train,
        contexts=[mx.cpu(i) for i in range(devices)],
        initializer=mx.init.Xavier(),
        optimizer_params={"learning_rate": 0.1, "momentum": 0.9},
        extensions=[
            FinishAfter(after_n_batches=6),
            TrainingMonitoring("acc"),  # a private head on the training executors
            Checkpoint(str(folder / "checkpoints")),
        ],
    )
    loop.run()
    return loop, folder


def test_onnxruntime_computes_what_loop_predict_computes_at_two_batch_sizes(trained):
    loop, folder = trained
    [exported] = export_onnx(loop, folder / "model.onnx")
    assert exported.inputs == {"data": ("batch", 1, 8, 8)} and exported.outputs == ["softmax"]
    assert exported.dynamic_batch and exported.max_difference < TOLERANCE
    for size in SIZES:
        rows = X[1500 : 1500 + size]
        expected = loop.predict(mx.io.NDArrayIter(rows, batch_size=size))["softmax"]
        [got] = run_onnx(exported.path, {"data": rows}, ["softmax"])
        assert got.shape == expected.shape
        np.testing.assert_allclose(got, expected, rtol=0, atol=TOLERANCE)
    model = onnx.load(exported.path)
    assert [(o.domain, o.version) for o in model.opset_import] == [("", 13)]
    assert [i.name for i in model.graph.input] == ["data"]  # the weights are no inputs
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"


def test_a_checkpoint_exports_what_the_loop_that_wrote_it_exports(trained):
    loop, folder = trained
    [from_loop] = export_onnx(loop, folder / "loop.onnx")
    directory = folder / "checkpoints"
    [newest] = [p for p in os.listdir(directory) if p.startswith("checkpoint-")]
    [from_directory] = export_onnx(directory, folder / "directory.onnx")
    [from_folder] = export_onnx(directory / newest, folder / "folder.onnx")
    assert from_directory.inputs == from_folder.inputs == from_loop.inputs
    rows = X[1500:1520]
    [want] = run_onnx(from_loop.path, {"data": rows})
    for exported in (from_directory, from_folder):
        [got] = run_onnx(exported.path, {"data": rows})
        np.testing.assert_array_equal(got, want)
    weights = {
        t.name: onnx.numpy_helper.to_array(t) for t in onnx.load(from_loop.path).graph.initializer
    }
    saved = {
        t.name: onnx.numpy_helper.to_array(t) for t in onnx.load(from_folder.path).graph.initializer
    }
    assert weights.keys() == saved.keys()
    for name, value in weights.items():
        np.testing.assert_array_equal(saved[name], value)


# ------------------------------------------------------------- a Gluon block
def three_channels(images):  # the digits as 3x16x16 images, for a model-zoo network
    return np.repeat(np.kron(images, np.ones((1, 1, 2, 2), "float32")), 3, axis=1)


@pytest.fixture(scope="module")
def gluon_loop(tmp_path_factory):
    from mxnet import gluon

    mx.random.seed(0)
    folder = tmp_path_factory.mktemp("resnet18")
    net = gluon.model_zoo.vision.resnet18_v1(thumbnail=True, classes=10)  # nothing downloaded
    net.initialize(mx.init.Xavier())
    train = mx.io.NDArrayIter(three_channels(X[:16]), Y[:16], batch_size=8, label_name="label")
    loop = MainLoop(
        net,
        train,
        loss=gluon.loss.SoftmaxCrossEntropyLoss(),
        optimizer_params={"learning_rate": 0.05},
        extensions=[FinishAfter(after_n_batches=2), Checkpoint(str(folder / "checkpoints"))],
    )
    loop.run()
    return loop, net, folder


def test_a_gluon_model_zoo_resnet_exports_from_the_loop_the_block_and_the_checkpoint(gluon_loop):
    loop, net, folder = gluon_loop
    [from_loop] = export_onnx(loop, folder / "loop.onnx")
    [from_block] = export_onnx(net, folder / "block.onnx", input_shapes=(4, 3, 16, 16))
    [from_checkpoint] = export_onnx(folder / "checkpoints", folder / "checkpoint.onnx")
    assert from_loop.outputs == from_block.outputs == from_checkpoint.outputs == ["output"]
    assert from_loop.dropped == {"loss": "'loss' reads label"}  # a loss needs the labels
    for size in SIZES:
        images = three_channels(X[1500 : 1500 + size])
        expected = loop.predict(mx.io.NDArrayIter(images, batch_size=size))["output"]
        for exported in (from_loop, from_block, from_checkpoint):
            [got] = run_onnx(exported.path, {"data": images})
            np.testing.assert_allclose(got, expected, rtol=0, atol=TOLERANCE)


# -------------------------------------------------------------------- buckets
class OneBucket(mx.io.DataIter):
    """One batch of sentences of one length, which says its bucket key (as BucketSentenceIter's)."""

    def __init__(self, tokens):
        super().__init__(len(tokens))
        self.tokens, self.default_bucket_key = tokens, tokens.shape[1]
        self.provide_data = [mx.io.DataDesc("data", tokens.shape)]
        self.provide_label = [mx.io.DataDesc("softmax_label", tokens.shape)]
        self.done = False

    def reset(self):
        self.done = False

    def next(self):
        if self.done:
            raise StopIteration
        self.done = True
        return mx.io.DataBatch(
            [mx.nd.array(self.tokens)],
            [mx.nd.zeros(self.tokens.shape)],
            pad=0,
            bucket_key=self.default_bucket_key,
            provide_data=self.provide_data,
            provide_label=self.provide_label,
        )


@pytest.fixture(scope="module")
def bucket_loop(tmp_path_factory):
    mx.random.seed(0)
    folder = tmp_path_factory.mktemp("lm")
    train = bucket_iter()
    with pytest.warns(UserWarning, match="leaves out the last partial batch"):
        loop = MainLoop(
            sym_gen_of(),
            train,
            default_bucket_key=train.default_bucket_key,
            initializer=mx.init.Xavier(),
            extensions=[FinishAfter(after_n_batches=6), Checkpoint(str(folder / "checkpoints"))],
        )
    loop.run()
    return loop, folder


def test_a_bucketed_network_exports_one_file_per_bucket_key(bucket_loop):
    loop, folder = bucket_loop
    exported = export_onnx(loop, folder / "lm.onnx")
    assert [e.key for e in exported] == [12, 4, 8]  # the default bucket first
    assert [os.path.basename(e.path) for e in exported] == ["lm-12.onnx", "lm-4.onnx", "lm-8.onnx"]
    rng = np.random.RandomState(5)
    for e in exported:
        assert e.inputs == {"data": ("batch", e.key)} and e.dynamic_batch
        for size in SIZES:
            tokens = rng.randint(1, 20, (size, e.key)).astype("float32")
            expected = loop.predict(OneBucket(tokens))["softmax"]  # on bucket e.key's graph
            [got] = run_onnx(e.path, {"data": tokens})
            np.testing.assert_allclose(got, expected, rtol=0, atol=TOLERANCE)
    # A checkpoint holds the default bucket's graph (MXNet's format): that one file.
    [saved] = export_onnx(folder / "checkpoints", folder / "saved.onnx")
    assert saved.key == 12 and saved.inputs == {"data": ("batch", 12)}
    tokens = rng.randint(1, 20, (BATCH, 12)).astype("float32")
    np.testing.assert_array_equal(
        run_onnx(saved.path, {"data": tokens})[0], run_onnx(exported[0].path, {"data": tokens})[0]
    )


# ------------------------------------------------- loss layers at inference
def module_checkpoint(symbol, prefix, data_shape, seed=0):
    """A Module checkpoint of ``symbol`` with random values; returns (arg_params, aux_params)."""
    shapes = {"data": data_shape}
    arg_shapes, _, aux_shapes = symbol.infer_shape_partial(**shapes)
    rng = np.random.RandomState(seed)
    args = {
        n: mx.nd.array(rng.uniform(-0.5, 0.5, s))
        for n, s in zip(symbol.list_arguments(), arg_shapes)
        if n != "data" and not n.endswith("_label")
    }
    aux = {
        n: mx.nd.array(rng.uniform(0.5, 1, s))
        for n, s in zip(symbol.list_auxiliary_states(), aux_shapes)
    }
    mx.model.save_checkpoint(str(prefix), 0, symbol, args, aux)
    return args, aux


def mxnet_outputs(symbol, params, rows):
    """MXNet's forward pass for inference (labels zero: they are not read), by output name."""
    args, aux = params
    executor = symbol.simple_bind(mx.cpu(), grad_req="null", data=rows.shape)
    for name, array in executor.arg_dict.items():
        array[:] = rows if name == "data" else args.get(name, 0)
    for name, array in executor.aux_dict.items():
        array[:] = aux[name]
    outputs = executor.forward(is_train=False)
    return {n[: -len("_output")]: o.asnumpy() for n, o in zip(symbol.list_outputs(), outputs)}


def heads():
    data = mx.sym.Variable("data")
    hidden = mx.sym.FullyConnected(mx.sym.flatten(data), num_hidden=12, name="fc")
    target = mx.sym.Variable("target_label")
    return {
        "softmax and regression": (
            mx.sym.Group(
                [
                    mx.sym.SoftmaxOutput(mx.sym.FullyConnected(hidden, num_hidden=4), name="cls"),
                    mx.sym.LinearRegressionOutput(
                        mx.sym.FullyConnected(hidden, num_hidden=1), name="reg"
                    ),
                ]
            ),
            ["cls", "reg"],
        ),
        "logistic, and a loss of the labels": (
            mx.sym.Group(
                [
                    mx.sym.LogisticRegressionOutput(hidden, name="logistic"),
                    mx.sym.MakeLoss(mx.sym.square(hidden - target), name="loss"),
                ]
            ),
            ["logistic"],
        ),
        "softmax over every axis but the batch's": (
            mx.sym.SoftmaxOutput(mx.sym.Convolution(data, kernel=(3, 3), num_filter=2), name="sm"),
            ["sm"],
        ),
        "softmax per position (multi_output)": (
            mx.sym.SoftmaxOutput(
                mx.sym.Convolution(data, kernel=(3, 3), num_filter=3), multi_output=True, name="sm"
            ),
            ["sm"],
        ),
    }


@pytest.mark.parametrize("case", list(heads()))
def test_loss_layers_export_as_what_they_compute_at_inference(case, tmp_path):
    symbol, outputs = heads()[case]
    params = module_checkpoint(symbol, tmp_path / "net", (2, 1, 8, 8))
    [exported] = export_onnx(
        tmp_path / "net", tmp_path / "net.onnx", input_shapes={"data": (2, 1, 8, 8)}
    )
    assert exported.outputs == outputs
    for size in SIZES:
        rows = X[1500 : 1500 + size]
        expected = mxnet_outputs(symbol, params, rows)
        for name, got in zip(outputs, run_onnx(exported.path, {"data": rows}, outputs)):
            np.testing.assert_allclose(got, expected[name], rtol=0, atol=TOLERANCE)


# ------------------------------------------------ where MXNet's exporter errs
def gaps():
    data = mx.sym.Variable("data")
    return {
        # BatchNorm(fix_gamma=True), MXNet's default, computes with gamma 1: the exporter
        # would read the stored gamma (here about 0.5, from module_checkpoint).
        "BatchNorm with fix_gamma": mx.sym.BatchNorm(
            mx.sym.Convolution(data, kernel=(3, 3), num_filter=4, name="conv"), name="bn"
        ),
        # MXNet's LRN has knorm=2 by default; the exporter writes bias 1.
        "LRN with its defaults": mx.sym.LRN(
            mx.sym.Convolution(data, kernel=(3, 3), num_filter=4, name="conv"), nsize=3
        ),
        # Deconvolution has no bias by default; the exporter assumes one, and fails.
        "Deconvolution without a bias": mx.sym.Deconvolution(
            data, kernel=(2, 2), stride=(2, 2), num_filter=2, name="deconv"
        ),
        # FullyConnected flattens an image by default; the exporter does not, and fails.
        "FullyConnected on an image": mx.sym.FullyConnected(data, num_hidden=5, name="fc"),
        # LayerNorm's ReduceMean follows opset 13, which the exporter checks against the
        # newest opset onnx knows (18+: axes an input) and fails.
        "LayerNorm": mx.sym.LayerNorm(mx.sym.flatten(data), name="ln"),
    }


@pytest.mark.parametrize("case", list(gaps()))
def test_what_mxnet_exporter_gets_wrong_is_exported_as_mxnet_computes(case, tmp_path):
    symbol = gaps()[case]
    params = module_checkpoint(symbol, tmp_path / "net", (2, 1, 8, 8))
    [exported] = export_onnx(
        tmp_path / "net", tmp_path / "net.onnx", input_shapes={"data": (2, 1, 8, 8)}
    )
    for size in SIZES:
        rows = X[1500 : 1500 + size]
        [expected] = mxnet_outputs(symbol, params, rows).values()
        [got] = run_onnx(exported.path, {"data": rows})
        np.testing.assert_allclose(got, expected, rtol=0, atol=TOLERANCE)


def test_a_graph_with_a_fixed_batch_is_exported_with_that_batch_and_says_why(tmp_path):
    data = mx.sym.Variable("data")
    symbol = mx.sym.FullyConnected(mx.sym.reshape(data, shape=(4, -1)), num_hidden=3, name="fc")
    params = module_checkpoint(symbol, tmp_path / "net", (4, 1, 8, 8))
    [exported] = export_onnx(
        tmp_path / "net", tmp_path / "net.onnx", input_shapes={"data": (4, 1, 8, 8)}
    )
    assert not exported.dynamic_batch and exported.inputs == {"data": (4, 1, 8, 8)}
    assert "batch size 1" in exported.note
    rows = X[1500:1504]
    [expected] = mxnet_outputs(symbol, params, rows).values()
    np.testing.assert_allclose(run_onnx(exported.path, {"data": rows})[0], expected, atol=TOLERANCE)


# ------------------------------------------------------------------ errors
def test_an_operator_the_exporter_lacks_is_named_with_its_layer_and_the_fix(tmp_path):
    data = mx.sym.Variable("data")
    symbol = mx.sym.SoftmaxOutput(
        mx.sym.FullyConnected(mx.sym.erf(mx.sym.flatten(data), name="gelu_erf"), num_hidden=3),
        name="softmax",
    )
    module_checkpoint(symbol, tmp_path / "net", (2, 1, 8, 8))
    with pytest.raises(OnnxExportError) as raised:
        export_onnx(tmp_path / "net", tmp_path / "net.onnx", input_shapes={"data": (2, 1, 8, 8)})
    message = str(raised.value)
    assert "no converter for the operator erf (layers 'gelu_erf')" in message
    assert "mx.onnx.get_operator_support(13)" in message and "mxoid.Predictor" in message
    assert not (tmp_path / "net.onnx").exists()


def test_a_setting_the_exporter_cannot_convert_is_named_not_a_traceback(tmp_path):
    data = mx.sym.Variable("data")
    symbol = mx.sym.Pooling(data, kernel=(2, 2), pool_type="sum", name="sum_pool")
    module_checkpoint(mx.sym.FullyConnected(symbol, num_hidden=2), tmp_path / "net", (2, 1, 8, 8))
    with pytest.raises(OnnxExportError) as raised:
        export_onnx(tmp_path / "net", tmp_path / "net.onnx", input_shapes={"data": (2, 1, 8, 8)})
    message = str(raised.value)
    assert "cannot convert the operator Pooling (layer 'sum_pool')" in message
    assert "pool_type=='sum'" in message and raised.value.__cause__ is None


def exporter_errs():
    data = mx.sym.Variable("data")
    hidden = mx.sym.FullyConnected(mx.sym.flatten(data), num_hidden=6)
    return {
        "a model that fails onnx.checker": (
            mx.sym.sum(mx.sym.reshape(hidden, shape=(0, 2, 3)), axis=1, exclude=True),
            "onnx.checker refuses the model MXNet's exporter wrote",
        ),
        "a layer that computes another shape": (  # exclude=True is ignored
            mx.sym.sum(hidden, axis=1, exclude=True),
            r"node name: sum\d+\): .* differ in dimension 0: \(2\) vs \(6\)",
        ),
    }


@pytest.mark.parametrize("case", list(exporter_errs()))
def test_a_wrong_conversion_is_an_error_not_a_file_that_computes_otherwise(case, tmp_path):
    symbol, says = exporter_errs()[case]
    module_checkpoint(symbol, tmp_path / "net", (2, 1, 8, 8))
    with pytest.raises(OnnxExportError, match=says):
        export_onnx(tmp_path / "net", tmp_path / "net.onnx", input_shapes={"data": (2, 1, 8, 8)})


def test_a_graph_onnxruntime_cannot_run_with_a_dynamic_batch_keeps_its_batch_and_says_why(
    tmp_path,
):
    data = mx.sym.Variable("data")  # the exporter's reverse needs the batch size
    symbol = mx.sym.reverse(mx.sym.FullyConnected(data, num_hidden=6, name="fc"), axis=1)
    params = module_checkpoint(symbol, tmp_path / "net", (2, 1, 8, 8))
    [exported] = export_onnx(
        tmp_path / "net", tmp_path / "net.onnx", input_shapes={"data": (2, 1, 8, 8)}
    )
    assert not exported.dynamic_batch and exported.inputs == {"data": (2, 1, 8, 8)}
    assert exported.note.startswith("with a dynamic batch axis, at batch size 2: onnxruntime")
    rows = X[1500:1502]
    [expected] = mxnet_outputs(symbol, params, rows).values()
    np.testing.assert_allclose(run_onnx(exported.path, {"data": rows})[0], expected, atol=TOLERANCE)


def test_outputs_farther_from_mxnet_than_the_tolerance_are_an_error(tmp_path):
    module_checkpoint(gaps()["LayerNorm"], tmp_path / "net", (2, 1, 8, 8))
    shapes = {"data": (2, 1, 8, 8)}
    [exported] = export_onnx(tmp_path / "net", tmp_path / "net.onnx", input_shapes=shapes)
    assert 0 < exported.max_difference < TOLERANCE  # float32 rounding, no more
    strict = exported.max_difference / 100  # the tolerance is relative to the outputs (~1)
    with pytest.raises(OnnxExportError, match=r"output 'ln' differs by .* \(tolerance"):
        export_onnx(
            tmp_path / "net", tmp_path / "strict.onnx", input_shapes=shapes, tolerance=strict
        )


def test_a_module_checkpoint_without_shapes_asks_for_them(tmp_path):
    module_checkpoint(NETWORKS["mlp"](), tmp_path / "net", (2, 1, 8, 8))
    with pytest.raises(ValueError, match=r"--input-shape data=1,\.\.\."):
        export_onnx(tmp_path / "net", tmp_path / "net.onnx")


# --------------------------------------------------------------- the command
def test_mxoid_export_writes_the_file_and_prints_the_check(trained, capsys):
    loop, folder = trained
    assert (
        mxoid_command(["export", str(folder / "checkpoints"), "-o", str(folder / "cli.onnx")]) == 0
    )
    printed = capsys.readouterr().out
    assert f"wrote {folder / 'cli.onnx'}: inputs data (batch, 1, 8, 8); outputs softmax" in printed
    assert "onnxruntime matches MXNet within" in printed
    rows = X[1500:1503]
    expected = loop.predict(mx.io.NDArrayIter(rows, batch_size=3))["softmax"]
    np.testing.assert_allclose(
        run_onnx(folder / "cli.onnx", {"data": rows})[0], expected, atol=TOLERANCE
    )
    assert mxoid_command(["export", str(folder / "nothing"), "-o", str(folder / "x.onnx")]) == 1
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("mxoid export: error: nothing saved at")


def test_mxoid_export_takes_the_shapes_a_module_checkpoint_lacks(tmp_path, capsys):
    symbol = NETWORKS["mlp"]()
    params = module_checkpoint(symbol, tmp_path / "net", (2, 1, 8, 8))
    command = ["export", str(tmp_path / "net"), "-o", str(tmp_path / "net.onnx")]
    assert mxoid_command(command + ["--input-shape", "data=4,1,8,8", "--fixed-batch"]) == 0
    assert "inputs data (4, 1, 8, 8); outputs softmax" in capsys.readouterr().out
    rows = X[1500:1504]
    expected = mxnet_outputs(symbol, params, rows)["softmax"]
    np.testing.assert_allclose(
        run_onnx(tmp_path / "net.onnx", {"data": rows})[0], expected, atol=TOLERANCE
    )
    assert mxoid_command(command) == 1  # no shapes: say how to give them
    assert "--input-shape data=1,..." in capsys.readouterr().err
    assert mxoid_command(command + ["--input-shape", "data=1,x"]) == 1
    assert "write NAME=D0,D1,... (data=1,3,32,32)" in capsys.readouterr().err
    assert mxoid_command(command + ["--input-shape", "data=4,1,9,9"]) == 1  # not its shape
    printed = capsys.readouterr()
    [line] = printed.err.splitlines()
    assert "cannot take inputs of the shapes {'data': (4, 1, 9, 9)}" in line and not printed.out
