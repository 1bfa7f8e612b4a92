"""mxoid.quantize: an int8 network (MXNet's MKLDNN quantization) that Predictor serves.

The ResNet-20 is trained by MainLoop on real data (scikit-learn's handwritten
digits) until its accuracy means something, and its int8 version is compared
with it on held-out digits.
"""

import mxnet as mx
import numpy as np
import pytest
from networks import digits_images, resnet20

from mxoid import Checkpoint, FinishAfter, MainLoop, Predictor, quantize
from mxoid.cli import main as mxoid_command

if not mx.runtime.Features().is_enabled("MKLDNN"):  # pragma: no cover
    pytest.skip(
        "int8 quantization needs MXNet with MKLDNN (the Linux wheels)", allow_module_level=True
    )

X, Y = digits_images()
TRAIN, HELD_OUT = slice(0, 1200), slice(1200, None)  # 597 held-out digits


def accuracy(probabilities):
    return float((probabilities.argmax(axis=1) == Y[HELD_OUT]).mean())


def calibration():  # training digits, in order
    return mx.io.NDArrayIter(X[TRAIN], batch_size=32)


def held_out():
    return mx.io.NDArrayIter(X[HELD_OUT], Y[HELD_OUT], batch_size=100)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """MXNet's ResNet-20 (BatchNorm, pre-activation units) trained 4 epochs on the digits."""
    mx.random.seed(0)
    np.random.seed(0)
    folder = tmp_path_factory.mktemp("resnet20")
    train = mx.io.NDArrayIter(
        X[TRAIN], Y[TRAIN], batch_size=32, shuffle=True, label_name="softmax_label"
    )
    loop = MainLoop(
        resnet20(),
        train,
        initializer=mx.init.Xavier(magnitude=2),
        optimizer_params={"learning_rate": 0.1, "momentum": 0.9, "wd": 1e-4},
        extensions=[FinishAfter(after_n_epochs=4), Checkpoint(str(folder / "checkpoints"))],
    )
    loop.run()
    return loop, train, folder


def test_int8_resnet20_is_within_one_percent_of_float32_on_held_out_digits(trained):
    loop, train, folder = trained
    float32 = loop.predict(held_out())["softmax"]
    model = quantize(
        folder / "checkpoints", train, mode="naive", num_batches=5, output=folder / "int8"
    )
    assert model.files == [f"{folder / 'int8'}-symbol.json", f"{folder / 'int8'}-0000.params"]
    assert model.calibration_samples == 160 and model.quantized_layers >= 20
    predictor = Predictor(folder / "int8")
    assert predictor.output_names == ["softmax"]
    int8 = predictor.predict(held_out())["softmax"]
    assert accuracy(float32) > 0.85  # trained: the comparison means something
    assert abs(accuracy(int8) - accuracy(float32)) <= 0.01
    assert np.abs(int8 - float32).max() > 1e-4  # computed in int8, not the float32 graph
    ops = {node["op"] for node in __import__("json").loads(model.symbol.tojson())["nodes"]}
    assert "_sg_mkldnn_conv" in ops and "_contrib_quantize_v2" in ops


def test_a_loop_quantizes_as_the_checkpoint_it_wrote(trained):
    loop, train, folder = trained
    from_loop = quantize(loop, calibration(), num_batches=3, output=folder / "from-loop")
    from_checkpoint = quantize(
        folder / "checkpoints", calibration(), num_batches=3, output=folder / "saved"
    )
    assert from_loop.symbol.tojson() == from_checkpoint.symbol.tojson()
    a = Predictor(folder / "from-loop").predict(held_out())["softmax"]
    b = Predictor(folder / "saved").predict(held_out())["softmax"]
    np.testing.assert_array_equal(a, b)


def test_mxoid_quantize_writes_what_quantize_returns(trained, capsys):
    loop, train, folder = trained
    np.save(folder / "inputs.npy", X[TRAIN][:96])
    status = mxoid_command(
        ["quantize", str(folder / "checkpoints"), "--calibration", str(folder / "inputs.npy")]
        + ["--num-batches", "3", "-o", str(folder / "cli")]
    )
    assert status == 0
    printed = capsys.readouterr().out
    assert "operators to int8 (naive calibration on 96 samples" in printed
    assert f"load it with mxoid.Predictor({str(folder / 'cli')!r})" in printed
    quantize(folder / "checkpoints", X[TRAIN][:96], num_batches=3, output=folder / "api")
    np.testing.assert_array_equal(
        Predictor(folder / "cli").predict(held_out())["softmax"],
        Predictor(folder / "api").predict(held_out())["softmax"],
    )
    np.savez(folder / "inputs.npz", data=X[TRAIN][:96])  # an array per input name
    status = mxoid_command(
        ["quantize", str(folder / "checkpoints"), "--calibration", str(folder / "inputs.npz")]
        + ["--num-batches", "3", "-o", str(folder / "npz")]
    )
    assert status == 0 and "calibration on 96 samples" in capsys.readouterr().out
    np.testing.assert_array_equal(
        Predictor(folder / "npz").predict(held_out())["softmax"],
        Predictor(folder / "api").predict(held_out())["softmax"],
    )
    assert (
        mxoid_command(
            [
                "quantize",
                str(folder / "checkpoints"),
                "--calibration",
                str(folder / "none.npy"),
                "-o",
                str(folder / "x"),
            ]
        )
        == 1
    )
    assert "cannot read calibration inputs" in capsys.readouterr().err


def test_entropy_calibration_of_an_mlp_from_a_gluon_block(tmp_path):
    from mxnet import gluon

    mx.random.seed(1)
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Flatten(), gluon.nn.Dense(32, activation="relu"), gluon.nn.Dense(10))
    net.initialize(mx.init.Xavier())
    train = mx.io.NDArrayIter(X[TRAIN], Y[TRAIN], batch_size=32, shuffle=True, label_name="label")
    loop = MainLoop(
        net,
        train,
        loss=gluon.loss.SoftmaxCrossEntropyLoss(),
        optimizer_params={"learning_rate": 0.1, "momentum": 0.9},
        extensions=[FinishAfter(after_n_epochs=5)],
    )
    loop.run()
    float32 = loop.predict(held_out())["output"]
    model = quantize(net, X[TRAIN], mode="entropy", num_batches=5, input_shapes=(32, 1, 8, 8))
    model.save(tmp_path / "int8")
    int8 = Predictor(tmp_path / "int8").predict(held_out())["output"]
    assert model.mode == "entropy" and model.quantized_layers >= 2
    assert accuracy(float32) > 0.85 and abs(accuracy(int8) - accuracy(float32)) <= 0.01


def test_a_calibration_mode_mxnet_refuses_is_refused_naming_the_choices(trained):
    loop, train, _ = trained
    with pytest.raises(ValueError, match=r"mode='none': choose one of \('naive', 'entropy'\)"):
        quantize(loop, train, mode="none")
    with pytest.raises(ValueError, match="the calibration data gave no batch"):
        quantize(loop, np.zeros((0, 1, 8, 8), "float32"))
